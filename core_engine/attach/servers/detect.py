"""Which family an exposition's sample names belong to: each family's own prefix (or its unprefixed
markers), one family per URL, a family that extends another (batchtop serve: vLLM's names plus its own)
only beside that one. What the server is comes from its answer, never from the URL."""

from __future__ import annotations

from batchtop.core_engine.attach.servers import families, family
from batchtop.core_engine.attach.servers.family import ServerFamily


def family_of(sample_name: str) -> ServerFamily | None:
    """The family a sample name belongs to; None for the rest (process_*, python_*, http_* and other
    collectors every server may carry)."""
    return next((f for f in families() if f.owns(sample_name)), None)


def flavours_in(sample_names: set[str]) -> dict[str, str]:
    """Each flavour found among the names (in the registry's order), with one of its names as the
    example: its running gauge where it has it."""
    found: dict[str, str] = {}
    for name in sorted(sample_names):
        owner = family_of(name)
        if owner is not None:
            running = owner.names.running if owner.names is not None else None
            if owner.name not in found or name == running:
                found[owner.name] = name
    return {f.name: found[f.name] for f in families() if f.name in found}


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def nothing_known() -> str:
    """The families an exposition may be, as BAD says when it is none of them."""
    text = [f for f in families() if f.names is not None]
    return _listed([f.label for f in text if f.extends is None] + [f.name for f in text if f.extends is not None])


def detect_flavour(sample_names: set[str]) -> str | None:
    """The server behind these names; None when it is none of them. Several servers' names in one
    exposition raise ValueError naming two of them: one URL is one server."""
    found = flavours_in(sample_names)
    extensions = {name: found.pop(name) for name in list(found) if family(name).extends is not None}
    if len(found) > 1:
        (a, name_a), (b, name_b) = list(found.items())[:2]
        raise ValueError(f"mixes {family(a).label} and {family(b).label} metrics ({name_a}, {name_b}): "
                         "one server per URL")
    for name, example in extensions.items():
        base = family(name).extends
        if found and base not in found:
            raise ValueError(f"{name}'s own metrics ({example}) beside {family(next(iter(found))).label}'s: "
                             f"{family(name).label} exposes {family(base).label}'s names")
    if not found:
        return None
    flavour = next(iter(found))
    return next((name for name in extensions if family(name).extends == flavour), flavour)
