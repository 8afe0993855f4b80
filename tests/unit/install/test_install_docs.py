"""Every command of docs/install.md runs: the ones that need no cluster as written, the ones
that change a cluster as the rendering they would apply (``kubectl kustomize`` for ``kubectl
apply/delete -k``, ``helm template`` for ``helm install/upgrade``); the devcluster overlay's
apply runs for real in tests/integration/test_install_devcluster.py, and every command of
"Upgrading from Kueue" (stopping Kueue, deleting its webhook configurations and APIServices,
taking over its CRDs) in tests/integration/test_install_from_kueue.py, against a stand-in of what
Kueue leaves; here they are checked to name Kueue's objects and Phalanx's. A command this test
does not know fails it, so the page cannot grow an unchecked one."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from install_tools import MANIFESTS, REPO, helm, kubectl, objects, run

from phalanx.operator import configfile

DOC = REPO / "docs" / "install.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
PHALANX = Path(sys.executable).parent / "phalanx"  # the console script of this environment


def _blocks(language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(DOC.read_text()) if lang == language]


def _commands() -> list[list[str]]:
    return [shlex.split(line) for block in _blocks("sh") for line in block.splitlines() if line]


def _helm_template(argv: list[str]) -> None:
    """``helm install|upgrade NAME CHART [flags]`` rendered with the same chart and values."""
    name, chart, *flags = argv[2:]
    flags = [f for f in flags if f != "--create-namespace"]
    out = run(helm(), "template", name, chart, *flags)
    assert any(o["kind"] == "Deployment" for o in objects(out))


def _image_build(argv: list[str]) -> None:
    """``docker|buildah build -f FILE -t TAG .``: the Dockerfile is there and the tag is the
    image the manifests run (building it is tests/integration/test_install_image.py)."""
    assert argv[-1] == "." and (REPO / argv[argv.index("-f") + 1]).is_file(), argv
    deployment = next(
        o
        for o in objects(run(kubectl(), "kustomize", MANIFESTS / "default"))
        if o["kind"] == "Deployment"
    )
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert argv[argv.index("-t") + 1] == image


# Kueue's objects, as its manifests name them (config/default: namespace kueue-system, prefix
# kueue-); tests/integration/test_install_from_kueue.py builds them and runs the commands.
KUEUE_OBJECTS = {
    ("deployment", "kueue-controller-manager"),
    ("mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration"),
    ("validatingwebhookconfiguration", "kueue-validating-webhook-configuration"),
    ("apiservice", "v1beta1.visibility.kueue.x-k8s.io"),
    ("apiservice", "v1beta2.visibility.kueue.x-k8s.io"),
    ("namespace", "kueue-system"),
}
READ_ONLY = {"get", "describe"}
KUEUE_KINDS = {"workloads", "clusterqueues", "localqueues", "resourceflavors", "pods", "jobs"}


def _names(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("-")]


def _crd_names() -> set[str]:
    return {
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (REPO / "crds").glob("*.yaml")
    }


def _upgrade_command(argv: list[str]) -> bool:
    """The commands of the upgrade sections that act on a live cluster; False if not one."""
    args = argv[1:]
    if args[:2] == ["-n", "kueue-system"]:
        args = args[2:]
        if args[:1] == ["scale"]:
            kind, _, name = args[1].partition("/")
            assert (kind, name) in KUEUE_OBJECTS and args[2:] == ["--replicas=0"], argv
            return True
        if args[:1] == ["get"]:
            assert args[1:] == ["pods"], argv
            return True
        return False
    if args[:2] == ["-n", "phalanx-system"] and args[2:4] == ["rollout", "status"]:
        deployments = [
            o["metadata"]["name"]
            for o in objects(run(kubectl(), "kustomize", MANIFESTS / "default"))
            if o["kind"] == "Deployment"
        ]
        assert args[4:] == [f"deployment/{name}" for name in deployments], argv
        return True
    verb = args[0]
    if verb == "delete" and "-k" not in args:
        kind, *names = _names(args[1:])
        assert names and all((kind, n) in KUEUE_OBJECTS for n in names), argv
        return True
    if verb == "annotate":
        kind, *rest = _names(args[1:])
        *names, annotation = rest
        assert kind == "crd" and names and set(names) <= _crd_names(), argv
        assert annotation == "cert-manager.io/inject-ca-from-", argv  # a removal only
        return True
    if verb in READ_ONLY:
        kind = _names(args[1:])[0]
        assert kind in KUEUE_KINDS, argv
        return True
    return False


def test_the_kueue_upgrade_is_run_by_its_integration_test():
    text = (REPO / "tests" / "integration" / "test_install_from_kueue.py").read_text()
    assert 'SECTION = "## Upgrading from Kueue"' in text
    assert "## Upgrading from Kueue\n" in DOC.read_text()


def test_every_command_of_the_page_runs(tmp_path: Path):
    commands = _commands()
    assert commands, "docs/install.md has no commands"
    ran = 0
    for argv in commands:
        program, verb = argv[0], argv[1] if len(argv) > 1 else ""
        if program == "phalanx" and verb == "crds":
            # Written where the page's next command applies it from (the working folder).
            run(PHALANX, *argv[1:], cwd=tmp_path)
            folder = tmp_path / argv[argv.index("--output") + 1]
            crds = objects(run(kubectl(), "kustomize", folder))
            assert len(crds) == 9 and all(o["kind"] == "CustomResourceDefinition" for o in crds)
            if "--v1beta1" in argv:
                served = {v["name"]: v["served"] for o in crds for v in o["spec"]["versions"]}
                assert served == {"v1beta2": True, "v1beta1": False}, argv
        elif program == "phalanx":
            run(PHALANX, *argv[1:], cwd=tmp_path)
            assert {"ca.crt", "tls.crt", "tls.key"} <= {
                p.name for p in (tmp_path / "certs").iterdir()
            }
        elif program == "kubectl" and "create" in argv and "--dry-run=client" in argv:
            command = " ".join(shlex.quote(str(a)) for a in [kubectl(), *argv[1:]])
            command = command.replace("'>'", ">")
            subprocess.run(
                command,
                shell=True,
                cwd=tmp_path,
                check=True,
                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            )
            secret = yaml.safe_load((tmp_path / "webhook-certs.yaml").read_text())
            assert secret["metadata"]["name"] == "phalanx-webhook-certs"
            assert {"ca.crt", "tls.crt", "tls.key"} <= secret["data"].keys()
        elif program == "kubectl" and verb in ("apply", "delete") and "-k" in argv:
            named = argv[argv.index("-k") + 1]
            written = tmp_path / named  # by a `phalanx crds` above it
            folder = written if written.is_dir() else REPO / named
            assert objects(run(kubectl(), "kustomize", folder)), folder
        elif program == "kubectl" and verb == "kustomize":
            assert objects(run(kubectl(), *argv[1:]))
        elif program == "kubectl" and _upgrade_command(argv):
            pass
        elif program == "helm" and verb in ("install", "upgrade"):
            _helm_template(argv)
        elif program in ("docker", "buildah") and verb == "build":
            _image_build(argv)
        elif program == "helm" and verb == "uninstall":
            assert argv[2] == "phalanx" and "phalanx-system" in argv  # the release installed above
        else:
            raise AssertionError(f"docs/install.md: no check for {shlex.join(argv)}")
        ran += 1
    assert ran == len(commands)


def test_the_overlay_example_renders_the_default_tree_with_every_component(tmp_path: Path):
    (example,) = [b for b in _blocks("yaml") if "kind: Kustomization" in b]
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    shutil.copytree(REPO / "crds", tmp_path / "crds")
    overlay = tmp_path / "manifests" / "overlays" / "production"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(example)
    kinds = {o["kind"] for o in objects(run(kubectl(), "kustomize", overlay))}
    assert {"Deployment", "ServiceMonitor", "NetworkPolicy", "Certificate"} <= kinds


def test_the_configuration_shown_is_the_shipped_one():
    (shown,) = [b for b in _blocks("yaml") if "kind: Configuration" in b]
    configmap = yaml.safe_load((MANIFESTS / "base" / "config.yaml").read_text())
    shipped = yaml.safe_load(configmap["data"]["controller_manager_config.yaml"])
    assert yaml.safe_load(shown) == shipped
    configfile.parse(yaml.safe_load(shown))


def test_the_metrics_reader_binding_shown_is_the_components():
    (shown,) = [b for b in _blocks("yaml") if "kind: ClusterRoleBinding" in b]
    shipped = yaml.safe_load(
        (MANIFESTS / "components" / "servicemonitor" / "metrics-reader-binding.yaml").read_text()
    )
    shipped["metadata"].pop("labels")
    assert yaml.safe_load(shown) == shipped
