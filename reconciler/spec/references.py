"""Load-time checks of what a spec's ``source`` may read: references and client properties.

Two kinds of check, both as ``SpecProblem``s with file:line:

* ``syntax_problems`` needs no settings (it runs wherever ``validate`` runs): a reference
  names an environment variable that can exist, a file argument holds no NUL, and no
  librdkafka property that runs a command or loads code is set (``grants.REFUSED_PROPERTIES``).
* ``grant_findings`` applies the operator's grants (``grants``): every ``${env:}`` names a
  granted and set variable, every ``${file:}`` (and every librdkafka property that reads a
  file) names a readable regular file of bounded size under the secrets directory, and
  each of them is granted to this spec's id and file name (``secretGrants``, when the
  operator set it; a file by its real path, links resolved).
  The daemon and ``plan`` run it on every pass (grants may change with SIGHUP; a spec's
  parse is cached, its grants are not); ``validate`` runs it when grants are given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from reconciler.errors import SpecProblem
from reconciler.model import file_stem
from reconciler.spec import grants as grants_mod
from reconciler.spec.grants import Grants
from reconciler.spec.secrets import references
from reconciler.spec.yamlsafe import ParsedYaml, YamlPath, format_field


def _strings(doc: Any, at: YamlPath) -> Iterator[tuple[YamlPath, str]]:
    if isinstance(doc, str):
        yield at, doc
    elif isinstance(doc, Mapping):
        for k, v in doc.items():
            yield from _strings(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _strings(v, (*at, i))


def _source(parsed: ParsedYaml) -> Any:
    return parsed.data.get("source") if isinstance(parsed.data, Mapping) else None


def _problem(parsed: ParsedYaml, at: YamlPath, message: str) -> SpecProblem:
    line, column = parsed.value_position(at)
    return SpecProblem(parsed.path, line, column, format_field(at), message)


def _properties(parsed: ParsedYaml) -> Iterator[tuple[YamlPath, str, Any]]:
    source = _source(parsed)
    props = source.get("consumerProperties") if isinstance(source, Mapping) else None
    if isinstance(props, Mapping):
        for key, value in props.items():
            yield ("source", "consumerProperties", key), str(key), value


def syntax_problems(parsed: ParsedYaml) -> list[SpecProblem]:
    out = []
    for at, value in _strings(_source(parsed), ("source",)):
        for kind, arg in references(value):
            if kind == "env" and not grants_mod.ENV_NAME.match(arg):
                out.append(_problem(parsed, at, f"${{env:{arg}}} does not name an environment variable "
                                                "(letters, digits and _)"))
            elif kind == "file" and "\0" in arg:
                out.append(_problem(parsed, at, "a ${file:} reference holds a NUL byte"))
    for at, key, value in _properties(parsed):
        why = grants_mod.check_property(key, str(value), None)
        if why:
            out.append(_problem(parsed, at, why))
    return out


def grant_findings(data: Any, grants: Grants, path: str) -> list[tuple[YamlPath, str]]:
    """(field, message) of every reference and file property ``grants`` do not allow to the
    spec ``data`` read from file ``path``, naming the setting that would grant it (positions
    are added by the caller, only when needed)."""
    parsed = ParsedYaml(path="", data=data)
    spec = (data.get("id") if isinstance(data, Mapping) else None, file_stem(path))
    out = []
    for at, value in _strings(_source(parsed), ("source",)):
        for kind, arg in references(value):
            if kind == "env":
                if not grants_mod.ENV_NAME.match(arg):
                    continue  # syntax_problems says so
                why = grants_mod.check_env(arg, grants) or grants.spec_may_use(*spec, "env", arg)
            else:
                why = grants_mod.check_file(arg, grants) or _file_for_spec(arg, spec, grants)
            if why:
                out.append((at, f"${{{kind}:{arg}}} is refused: it {why}"))
    for at, key, value in _properties(parsed):
        if grants_mod.reads_file(key, value) and not any(True for _ in references(value)):
            why = grants_mod.check_property(key, value, grants)
            if not why:
                why = _file_for_spec(value, spec, grants)
                why = f"{key} reads a file and {why}" if why else None
            if why:
                out.append((at, why))
    return out


def _file_for_spec(arg: str, spec: tuple[Any, str], grants: Grants) -> str | None:
    """Why this spec (id, file name) may not read the (already granted) file ``arg`` names,
    or None; the file is judged by its real path, never by the name of a link to it."""
    path, why = grants_mod._target(arg, grants)
    if why or path is None:
        return why
    return grants.spec_may_use(*spec, "file", grants.file_name(path))
