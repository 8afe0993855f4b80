"""What the plugin's verbs share: the common flags, credentials, the API client, kubectl's
output (``kind.group/name operation``, or the object with ``-o yaml|json``) and error messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import yaml

from phalanx.cli import kube_access
from phalanx.operator.kube import ApiError, KubeApi, Resource

KUEUE = "kueue.x-k8s.io"
KINDS: dict[str, Resource] = {
    "clusterqueue": Resource(KUEUE, "v1beta2", "clusterqueues", namespaced=False),
    "localqueue": Resource(KUEUE, "v1beta2", "localqueues"),
    "resourceflavor": Resource(KUEUE, "v1beta2", "resourceflavors", namespaced=False),
    "workload": Resource(KUEUE, "v1beta2", "workloads"),
}
ALIASES = {"cq": "clusterqueue", "lq": "localqueue", "rf": "resourceflavor", "wl": "workload"}


class PluginError(Exception):
    """A failure to report as ``error: <message>`` with exit code 1."""


def add_connection_flags(parser: argparse.ArgumentParser, *, namespaced: bool) -> None:
    if namespaced:
        parser.add_argument("-n", "--namespace", help="the namespace (the context's by default)")
    kube_access.add_connection_args(parser)


def add_output_flags(parser: argparse.ArgumentParser, *, dry_run: bool = True) -> None:
    parser.add_argument(
        "-o", "--output", choices=("name", "yaml", "json"), help="print the object (yaml|json)"
    )
    if dry_run:
        parser.add_argument(
            "--dry-run",
            choices=("none", "client", "server"),
            default="none",
            help="client: only print the object; server: the API server validates, stores nothing",
        )


def run_with_api(args: argparse.Namespace, body: Callable[[KubeApi, str], Awaitable[int]]) -> int:
    """Load credentials as kubectl does, run ``body(api, namespace)``, print its errors."""
    auth = kube_access.connect(args)
    if auth is None:
        return 2
    namespace = getattr(args, "namespace", None) or auth.default_namespace

    async def main() -> int:
        api = KubeApi(auth)
        try:
            return await body(api, namespace)
        finally:
            await api.close()

    try:
        return asyncio.run(main())
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def api_message(error: ApiError, *, kind: str, name: str) -> str:
    """``clusterqueue X not found`` for a 404, else the API server's own message."""
    if error.not_found:
        return f"{kind} {name} not found"
    return str(error.body.get("message") or error)


def dry_run_params(dry_run: str) -> dict[str, str] | None:
    return {"dryRun": "All"} if dry_run == "server" else None


async def get(api: KubeApi, kind: str, name: str, namespace: str | None) -> dict[str, Any]:
    resource = KINDS[kind]
    try:
        return await api.get(resource, name, namespace=namespace if resource.namespaced else None)
    except ApiError as error:
        raise PluginError(api_message(error, kind=kind, name=name)) from None


async def create(
    api: KubeApi, kind: str, body: Mapping[str, Any], *, dry_run: str
) -> dict[str, Any]:
    """POST the object (``dryRun=All`` for a server dry run); a client dry run sends nothing."""
    if dry_run == "client":
        return dict(body)
    resource = KINDS[kind]
    namespace = body["metadata"].get("namespace")
    try:
        return await api.request(
            "POST", resource.path(namespace=namespace), params=dry_run_params(dry_run), body=body
        )
    except ApiError as error:
        raise PluginError(str(error.body.get("message") or error)) from None


async def merge_patch(
    api: KubeApi, kind: str, name: str, namespace: str | None, patch: Any, *, dry_run: str
) -> dict[str, Any]:
    """Read the object (so that a missing one is ``not found``), then merge-patch it."""
    current = await get(api, kind, name, namespace)
    if dry_run == "client":
        return _merged(current, patch)
    resource = KINDS[kind]
    path = resource.path(namespace=namespace if resource.namespaced else None, name=name)
    try:
        return await api.request(
            "PATCH",
            path,
            params=dry_run_params(dry_run),
            body=patch,
            content_type="application/merge-patch+json",
        )
    except ApiError as error:
        raise PluginError(api_message(error, kind=kind, name=name)) from None


def _merged(obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def print_result(
    obj: Mapping[str, Any], *, output: str | None, operation: str, dry_run: str
) -> None:
    """As kubectl's printers: the object for ``-o yaml|json``, else ``kind.group/name op``."""
    if output == "json":
        print(json.dumps(obj, indent=4))
    elif output == "yaml":
        print(yaml.safe_dump(dict(obj), sort_keys=False), end="")
    else:
        print(name_line(obj, operation=operation, dry_run=dry_run))


def name_line(obj: Mapping[str, Any], *, operation: str, dry_run: str) -> str:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    kind = str(obj.get("kind", "")).lower()
    line = (
        f"{kind}.{group}/{obj['metadata']['name']}"
        if group
        else f"{kind}/{obj['metadata']['name']}"
    )
    suffix = {"client": " (client dry run)", "server": " (server dry run)"}.get(dry_run, "")
    return f"{line} {operation}{suffix}" if operation else f"{line}{suffix}"
