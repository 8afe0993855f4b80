"""Devcluster addons: names, the cache folder keyed by the addon's own pins, the JobSet
controller's configuration and its loopback webhook configurations."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from phalanx.devcluster import addons, pins


def test_with_names_are_split_deduplicated_and_checked() -> None:
    assert addons.parse_names(["jobset", "jobset,"]) == ("jobset",)
    assert addons.parse_names([]) == ()
    with pytest.raises(addons.AddonError, match=r"unknown addon.*nope.*can start jobset"):
        addons.parse_names(["jobset,nope"])


def test_the_cache_folder_is_keyed_by_the_addons_own_go_mod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "repo"
    (root / "devcluster" / "jobset").mkdir(parents=True)
    (root / "devcluster" / "jobset" / "go.mod").write_text("module x\nrequire a v1\n")
    (root / "devcluster" / "jobset" / "go.sum").write_text("a v1 h1:x\n")
    first = addons.addon_cache(addons.JOBSET, root)
    assert first.folder.parent == tmp_path / "cache"
    assert first.key.startswith("jobset-v0.10.1-")
    (root / "devcluster" / "jobset" / "go.sum").write_text("a v2 h1:y\n")
    assert addons.addon_cache(addons.JOBSET, root).key != first.key
    assert not first.complete(addons.JOBSET)


def test_the_checkout_pins_jobset_at_the_version_the_addon_names() -> None:
    gomod = (pins.repo_root() / "devcluster" / "jobset" / "go.mod").read_text()
    assert f"sigs.k8s.io/jobset {addons.JOBSET.version}" in gomod


def test_jobset_webhooks_are_jobsets_own_by_loopback_url_and_pods_only_of_jobsets() -> None:
    mutating, validating = addons.jobset_webhooks(port=4443, ca_bundle=b"CA")
    hooks = {h["name"]: h for doc in (mutating, validating) for h in doc["webhooks"]}
    assert set(hooks) == {"mjobset.kb.io", "mpod.kb.io", "vjobset.kb.io", "vpod.kb.io"}
    assert hooks["mjobset.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/mutate-jobset-x-k8s-io-v1alpha2-jobset",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert hooks["vjobset.kb.io"]["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    for name in ("mpod.kb.io", "vpod.kb.io"):
        assert hooks[name]["objectSelector"] == {
            "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
        }
    assert "objectSelector" not in hooks["mjobset.kb.io"]


def test_the_checkout_pins_lws_at_the_version_the_addon_names() -> None:
    gomod = (pins.repo_root() / "devcluster" / "lws" / "go.mod").read_text()
    assert f"sigs.k8s.io/lws {addons.LWS.version}" in gomod
    assert addons.parse_names(["lws"]) == ("lws",)


def test_lws_webhooks_are_lws_own_by_loopback_url_and_pods_only_of_lws() -> None:
    # Catches: a pod webhook without the objectSelector (every pod of the cluster would wait
    # on the addon) or a path the LWS manager does not serve.
    mutating, validating = addons.lws_webhooks(port=4443, ca_bundle=b"CA")
    hooks = {h["name"]: h for doc in (mutating, validating) for h in doc["webhooks"]}
    assert set(hooks) == {
        "mleaderworkerset.kb.io",
        "mpod.kb.io",
        "vleaderworkerset.kb.io",
        "vpod.kb.io",
    }
    assert hooks["mleaderworkerset.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert hooks["vpod.kb.io"]["clientConfig"]["url"] == "https://127.0.0.1:4443/validate--v1-pod"
    for name in ("mpod.kb.io", "vpod.kb.io"):
        assert hooks[name]["objectSelector"] == {
            "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
        }
        assert hooks[name]["rules"][0]["resources"] == ["pods"]
    assert "objectSelector" not in hooks["mleaderworkerset.kb.io"]
    assert (
        mutating["metadata"]["name"]
        != addons.jobset_webhooks(port=1, ca_bundle=b"")[0]["metadata"]["name"]
    )


def test_the_checkout_pins_kuberay_at_the_version_the_addon_names() -> None:
    gomod = (pins.repo_root() / "devcluster" / "ray" / "go.mod").read_text()
    assert f"github.com/ray-project/kuberay/ray-operator {addons.RAY.version}" in gomod
    assert addons.parse_names(["jobset,ray"]) == ("jobset", "ray")


def test_kuberay_runs_on_loopback_without_leader_election_or_metrics(tmp_path: Path) -> None:
    launch = addons.Launch(
        layout=None,  # type: ignore[arg-type]
        folder=tmp_path,
        cert_dir=tmp_path,
        health_port=8081,
        webhook_port=9443,
    )
    argv = addons.RAY.arguments(launch)
    assert "--health-probe-bind-address=127.0.0.1:8081" in argv
    assert "--metrics-addr=0" in argv and "--enable-leader-election=false" in argv
    # KubeRay serves its webhook only with ENABLE_WEBHOOKS=true: none to register.
    assert addons.RAY.webhooks is None


def test_the_checkout_pins_trainer_at_the_version_the_addon_names() -> None:
    gomod = (pins.repo_root() / "devcluster" / "trainer" / "go.mod").read_text()
    assert f"github.com/kubeflow/trainer/v2 {addons.TRAINER.version}" in gomod
    assert addons.parse_names(["jobset,trainer"]) == ("jobset", "trainer")
    # A TrainJob runs as a JobSet: asking for the trainer starts JobSet's controller first.
    assert addons.parse_names(["trainer"]) == ("jobset", "trainer")
    assert addons.parse_names(["trainer,lws,jobset"]) == ("jobset", "trainer", "lws")


def test_trainer_serves_on_loopback_with_the_devcluster_certificate_in_its_temp_dir(
    tmp_path: Path,
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_text("CERT")
    (certs / "tls.key").write_text("KEY")
    launch = addons.Launch(
        layout=None,  # type: ignore[arg-type]
        folder=tmp_path / "trainer",
        cert_dir=certs,
        health_port=8081,
        webhook_port=9443,
    )
    launch.folder.mkdir()
    argv = addons.TRAINER.arguments(launch)
    config = yaml.safe_load((launch.folder / "config.yaml").read_text())
    assert argv[0] == f"--config={launch.folder / 'config.yaml'}"
    assert config["certManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:8081"}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["metrics"] == {"bindAddress": "0"}
    # No setting names the certificate folder: controller-runtime's default under TMPDIR.
    assert addons.TRAINER.environment is not None
    env = addons.TRAINER.environment(launch)
    served = Path(env["TMPDIR"]) / "k8s-webhook-server" / "serving-certs"
    assert served.is_relative_to(launch.folder)
    assert (served / "tls.crt").read_text() == "CERT"
    assert (served / "tls.key").read_text() == "KEY"
    assert (served / "tls.key").stat().st_mode & 0o077 == 0


def test_trainer_webhooks_are_trainers_own_by_loopback_url() -> None:
    mutating, validating = addons.trainer_webhooks(port=4443, ca_bundle=b"CA")
    assert [h["name"] for h in mutating["webhooks"]] == ["defaulter.trainjob.trainer.kubeflow.org"]
    hooks = {h["name"]: h for h in validating["webhooks"]}
    assert set(hooks) == {
        "validator.clustertrainingruntime.trainer.kubeflow.org",
        "validator.trainingruntime.trainer.kubeflow.org",
        "validator.trainjob.trainer.kubeflow.org",
    }
    assert mutating["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    runtime = hooks["validator.trainingruntime.trainer.kubeflow.org"]
    assert runtime["clientConfig"]["url"].endswith(
        "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime"
    )
    assert runtime["rules"] == [
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["trainingruntimes"],
        }
    ]
