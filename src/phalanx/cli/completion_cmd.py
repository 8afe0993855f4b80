"""``completion bash|zsh|fish``: shell completion for ``phalanx`` and ``kubectl-phalanx``.

The scripts ask the command itself for candidates: ``phalanx __complete WORD... CURRENT`` prints
one per line. Verbs, kinds and flags come from the argument parser, so they never drift from
it; after ``-n``/``--namespace`` the namespaces, and after ``stop|resume|delete KIND`` the
objects' names, come from the API (as kueuectl completes them), quietly nothing when it cannot
be reached.

Install: ``source <(phalanx completion bash)`` (zsh: ``source <(phalanx completion zsh)``;
fish: ``phalanx completion fish | source``). ``kubectl phalanx <TAB>`` goes through kubectl's
own completion, which runs ``kubectl_complete-phalanx WORD...`` (installed with the plugin) and
reads cobra's answer: the candidates, then ``:4`` (no file names).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

from phalanx.operator.kube import ApiError, KubeApi, Resource

COMMAND = "__complete"
PROGRAMS = ("phalanx", "kubectl-phalanx")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
NAMED_VERBS = ("stop", "resume", "delete")

BASH = """# bash completion for phalanx and kubectl-phalanx: source <(phalanx completion bash)
_phalanx_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}" IFS=$'\\n'
    local candidates
    candidates="$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null)"
    COMPREPLY=($(compgen -W "$candidates" -- "$cur"))
}
complete -o default -F _phalanx_complete phalanx kubectl-phalanx
"""

ZSH = """#compdef phalanx kubectl-phalanx
# zsh completion for phalanx and kubectl-phalanx: source <(phalanx completion zsh)
_phalanx() {
    local -a candidates
    candidates=("${(@f)$("${words[1]}" __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    compadd -a candidates
}
compdef _phalanx phalanx kubectl-phalanx
"""

FISH = """# fish completion for phalanx and kubectl-phalanx: phalanx completion fish | source
function __phalanx_complete
    set -l tokens (commandline -opc) (commandline -ct)
    $tokens[1] __complete $tokens[2..-1] 2>/dev/null
end
complete -c phalanx -f -a '(__phalanx_complete)'
complete -c kubectl-phalanx -f -a '(__phalanx_complete)'
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH, "fish": FISH}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "completion",
        help="print the shell completion script (bash, zsh, fish)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("shell", choices=sorted(SCRIPTS))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(SCRIPTS[args.shell], end="")
    return 0


def kubectl_complete() -> int:
    """The ``kubectl_complete-phalanx`` executable kubectl runs to complete the plugin."""
    import sys

    from phalanx.cli.main import build_parser

    for candidate in complete(build_parser(), sys.argv[1:]):
        print(candidate)
    print(":4")  # cobra's ShellCompDirectiveNoFileComp
    return 0


def complete(parser: argparse.ArgumentParser, words: Sequence[str]) -> list[str]:
    """The candidates for the last of ``words`` (the arguments after the program's name)."""
    *before, current = list(words) or [""]
    if before and before[-1] in ("-n", "--namespace"):
        return [n for n in _from_api(before, None) if n.startswith(current)]
    sub, verb, local = _walk(parser, before)
    if current.startswith("-"):
        return sorted(o for a in sub._actions for o in a.option_strings if o.startswith(current))
    choices = _positional_choices(sub, len(local))
    if choices:
        return [c for c in choices if c.startswith(current)]
    if verb in NAMED_VERBS and len(local) == 1:
        return [n for n in _from_api(before, local[0]) if n.startswith(current)]
    return []


def _walk(
    parser: argparse.ArgumentParser, words: Sequence[str]
) -> tuple[argparse.ArgumentParser, str, list[str]]:
    """The (sub)parser the words lead to, the verb, and the positional words given to that
    parser so far (flag values skipped)."""
    current, verb, skip = parser, "", False
    local: list[str] = []
    for word in words:
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            action = next((a for a in current._actions if word in a.option_strings), None)
            skip = action is not None and action.nargs != 0 and "=" not in word
            continue
        subparsers = _subparsers(current)
        if subparsers is not None and word in subparsers.choices:
            current, local = subparsers.choices[word], []
            verb = verb or word
            continue
        local.append(word)
    return current, verb, local


def _subparsers(parser: argparse.ArgumentParser) -> Any:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _positional_choices(parser: argparse.ArgumentParser, index: int) -> list[str]:
    """Choices of the parser's positional at ``index``: its subcommands or an argument's."""
    subparsers = _subparsers(parser)
    if subparsers is not None:
        return [c for c in subparsers.choices if not c.startswith("_")] if index == 0 else []
    positional = [a for a in parser._actions if not a.option_strings]
    choices = positional[index].choices if index < len(positional) else None
    return [str(c) for c in choices] if choices else []


def _from_api(words: Sequence[str], kind: str | None) -> list[str]:
    """Namespaces (``kind`` None) or the names of one kind, reading the connection flags from
    the words; nothing when the API cannot answer."""
    from phalanx.cli.plugin_client import ALIASES, KINDS
    from phalanx.operator import kubeconfig

    flags = _flag_values(words)
    resource = NAMESPACES if kind is None else KINDS.get(ALIASES.get(kind, kind))
    if resource is None:
        return []
    try:
        auth = kubeconfig.load(flags.get("--kubeconfig"), context=flags.get("--context"))
    except (kubeconfig.KubeconfigError, OSError):
        return []
    namespace = flags.get("-n") or flags.get("--namespace") or auth.default_namespace

    async def names() -> list[str]:
        api = KubeApi(auth)
        try:
            items = await asyncio.wait_for(api.list_all(resource, namespace=namespace), 5)
        except (ApiError, OSError, TimeoutError):
            return []
        finally:
            await api.close()
        return sorted(str(i["metadata"]["name"]) for i in items)

    try:
        return asyncio.run(names())
    except Exception:  # completion must never print a traceback into the shell
        return []


def _flag_values(words: Sequence[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for i, word in enumerate(words):
        if word.startswith("-") and "=" in word:
            key, _, value = word.partition("=")
            values[key] = value
        elif word.startswith("-") and i + 1 < len(words):
            values[word] = words[i + 1]
    return values
