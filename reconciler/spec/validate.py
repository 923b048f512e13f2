"""JSON Schema validation of a parsed spec or marker, with errors a person can act on.

The second step of loading desired state, after ``yamlsafe``: the document is
checked against ``schemas/supervisor.schema.json`` (specs) or
``schemas/marker.schema.json`` (markers) with Draft 2020-12, and every
``jsonschema`` error becomes a ``SpecProblem`` with file, line, column, the dotted
field (``dataSchema.metrics[1].field``) and a message: unknown keys point at the
key and suggest the closest allowed one, wrong values point at the value, missing
keys point at the mapping that lacks them, and ``oneOf`` failures are narrowed to
the branch the user meant (``source`` by its ``type``, positions by their key).
Timestamps are then checked with ``timeparse`` (they must parse and not lie in the
future), durations against their lower bound, and what the pipeline and the clients would
refuse later (column names, the stream URI, references and client properties; see
``columns``, ``uris``, ``references``). Problems come back sorted by line.

Two keywords follow the JSON Schema specification more strictly than Python's
``jsonschema`` does by default, because its lenient readings let bad values through:
``pattern`` anchors ``$`` at the very end (ECMA-262, as the specification says; Python's
``$`` also matches before a final newline, so ``id: "nl\n"`` passed), and ``integer``
means a whole number written as one (``2.0`` and ``1.0e+300`` are numbers a person did
not mean as counts).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator, ValidationError, validators
from referencing import Registry, Resource

from reconciler.errors import SpecProblem
from reconciler.model import parse_duration
from reconciler.spec import columns, formats, references
from reconciler.spec.timeparse import TimestampError, parse_timestamp
from reconciler.spec.uris import UriInvalid, split_stream_uri
from reconciler.spec.yamlsafe import ParsedYaml, YamlPath, format_field

SchemaKind = Literal["spec", "marker"]

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
_FILES: dict[str, str] = {"spec": "supervisor.schema.json", "marker": "marker.schema.json"}
# Where timestamps sit in each kind of document, checked after the schema.
_TIMESTAMP_PATHS: dict[str, tuple[YamlPath, ...]] = {
    "spec": (("startFrom", "timestamp"), ("backfill", "resetTo", "timestamp")),
    "marker": (("resetTo", "timestamp"),),
}
_JSON_TYPE_WORDS = {"object": "mapping", "array": "list", "number": "number", "null": "null"}


@functools.cache
def load_schema(kind: SchemaKind) -> Mapping[str, Any]:
    """The JSON Schema document for specs (``"spec"``) or markers (``"marker"``)."""
    return json.loads((SCHEMA_DIR / _FILES[kind]).read_text(encoding="utf-8"))


@functools.cache
def schema_registry() -> Registry:
    """Both schemas by ``$id``, so the marker's ``$ref`` into the spec schema resolves."""
    resources = [(load_schema(k)["$id"], Resource.from_contents(load_schema(k))) for k in _FILES]
    return Registry().with_resources(resources)


MIN_TASK_DURATION = 0.1  # seconds: below this a supervisor would spin on batch overhead alone
# Every duration the schema allows: each is bounded by ``model.MAX_DURATION`` (a pattern cannot
# say "at most 10 years"; a larger one overflowed the date it was added to, issue 41.1).
_DURATION_PATHS: tuple[YamlPath, ...] = (("taskDuration",), ("lagPolicy", "maxLag"), ("lagPolicy", "for"),
                                         ("lagPolicy", "cooldown"))
_COLUMN_PATHS: tuple[YamlPath, ...] = (("dataSchema", "dimensions"), ("dataSchema", "metrics"),
                                       ("dataSchema", "granularity"))


@functools.cache
def _ecma_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` with ECMA-262's ``$`` (end of input only) in Python's syntax: every ``$``
    that is neither escaped nor inside a character class becomes ``\\Z``."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "[":
            in_class = True
        elif ch == "]":
            in_class = False
        out.append("\\Z" if ch == "$" and not in_class else ch)
        i += 1
    return re.compile("".join(out))


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _is_integer(_checker, instance) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = validators.extend(
    Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@functools.cache
def validator(kind: SchemaKind) -> Draft202012Validator:
    return _StrictValidator(load_schema(kind), registry=schema_registry())


def validate_document(
    parsed: ParsedYaml, kind: SchemaKind = "spec", *, now: datetime | None = None
) -> list[SpecProblem]:
    """Every problem of one parsed document, sorted by line; empty when valid."""
    translator = _Translator(parsed)
    for error in validator(kind).iter_errors(parsed.data):
        translator.translate(error)
    problems = translator.finish()
    now = now or datetime.now(UTC)
    for at in _TIMESTAMP_PATHS[kind]:
        value = _get(parsed.data, at)
        if isinstance(value, str) and not any(_within(p.field, at) for p in problems):
            try:
                parse_timestamp(value, now)
            except TimestampError as exc:
                problems.append(_problem(parsed, parsed.value_position(at), at, str(exc)))
    if kind == "spec":
        problems += _duration_problems(parsed, problems) + _static_problems(parsed, problems)
    return sort_problems(problems)


def _duration_problems(parsed: ParsedYaml, found: list[SpecProblem]) -> list[SpecProblem]:
    problems = []
    for at in _DURATION_PATHS:
        value = _get(parsed.data, at)
        if not isinstance(value, str) or any(_within(p.field, at) for p in found):
            continue
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            problems.append(_problem(parsed, parsed.value_position(at), at, str(exc)))
            continue
        if at == ("taskDuration",) and seconds < MIN_TASK_DURATION:
            problems.append(_problem(parsed, parsed.value_position(at), at,
                                     f"{value!r} is too short: at least {MIN_TASK_DURATION * 1000:.0f}ms"))
    return problems


def _static_problems(parsed: ParsedYaml, found: list[SpecProblem]) -> list[SpecProblem]:
    """What the pipeline and the clients refuse that the schema cannot say: column names
    (``columns``), the stream URI (``uris``), references and client properties (``references``)."""
    out: list[SpecProblem] = []
    if not any(_within(p.field, at) for p in found for at in _COLUMN_PATHS):
        out += columns.problems(parsed)
    if not any(_within(p.field, ("dataSchema",)) for p in found):
        out += formats.problems(parsed)
    if not any(_within(p.field, ("source",)) for p in found):
        out += references.syntax_problems(parsed)
        source = parsed.data.get("source")
        if isinstance(source, Mapping) and source.get("type") == "rabbitmq" and isinstance(source.get("uri"), str):
            try:
                split_stream_uri(source["uri"])
            except UriInvalid as exc:
                at = ("source", "uri")
                out.append(_problem(parsed, parsed.value_position(at), at,
                                    f"invalid RabbitMQ stream URI: {exc}"))  # never the URI: see parse_problem
    return out


def validate_data(
    data: Any, kind: SchemaKind = "spec", *, path: str = "<document>", now: datetime | None = None
) -> list[SpecProblem]:
    """``validate_document`` for data that did not come from a file (no positions)."""
    return validate_document(ParsedYaml(path=path, data=data), kind, now=now)


def sort_problems(problems: Iterable[SpecProblem]) -> list[SpecProblem]:
    """Deduplicated, by line then column (problems without a line first)."""
    unique = dict.fromkeys(problems)
    return sorted(unique, key=lambda p: (p.line or 0, p.column or 0, p.field, p.message))


class _Translator:
    """Turns ``jsonschema`` errors into ``SpecProblem``s located in one file."""

    def __init__(self, parsed: ParsedYaml):
        self.parsed = parsed
        self.problems: list[SpecProblem] = []
        # (mapping, key, message) of missing keys; (mapping, key) an unknown key resembles
        self._missing: list[tuple[YamlPath, str, str]] = []
        self._suggested: set[tuple[YamlPath, str]] = set()

    def finish(self) -> list[SpecProblem]:
        """The problems, leaving out "missing 'topic'" when a typo 'topc' already explains it."""
        for at, key, message in self._missing:
            if (at, key) not in self._suggested:
                self.add(at, message, key=True)
        self._missing.clear()
        return self.problems

    def add(self, at: YamlPath, message: str, *, key: bool = False) -> None:
        where = self.parsed.key_position(at) if key else self.parsed.value_position(at)
        self.problems.append(_problem(self.parsed, where, at, message))

    def translate(self, error: ValidationError) -> None:
        at = tuple(error.absolute_path)
        handler = getattr(self, f"_on_{error.validator}", None)
        if handler is None:
            self.add(at, error.message)
        else:
            handler(error, at)

    # --- keywords -----------------------------------------------------------------

    def _on_additionalProperties(self, error: ValidationError, at: YamlPath) -> None:
        allowed = sorted(error.schema.get("properties", {}))
        if not isinstance(error.instance, Mapping):
            return
        for key in error.instance:
            if key not in allowed:
                self._unknown_key(at, str(key), allowed)

    def _unknown_key(
        self, at: YamlPath, key: str, allowed: list[str], otherwise: str | None = None
    ) -> None:
        suggestion = closest(key, allowed)
        if suggestion:
            self._suggested.add((at, suggestion))
        message = unknown_key_message(key, allowed)
        if otherwise and not suggestion:
            message = otherwise
        self.add((*at, key), message, key=True)

    def _on_required(self, error: ValidationError, at: YamlPath) -> None:
        if not isinstance(error.instance, Mapping):
            return
        why = ""
        if "then" in error.relative_schema_path and "type" in error.instance:
            why = f" (required for type '{error.instance['type']}')"
        for key in error.validator_value:
            if key not in error.instance:
                self._missing.append((at, key, f"missing required key '{key}'{why}"))

    def _on_type(self, error: ValidationError, at: YamlPath) -> None:
        expected = error.validator_value
        names = [expected] if isinstance(expected, str) else list(expected)
        words = [_JSON_TYPE_WORDS.get(n, n) for n in names]
        wanted = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
        hint = ""
        if names == ["string"] and isinstance(error.instance, bool | int | float):
            hint = " (YAML read it as a non-string; put it in quotes)"
        self.add(at, f"expected {wanted}, got {describe_value(error.instance)}{hint}")

    def _on_enum(self, error: ValidationError, at: YamlPath) -> None:
        options = [str(o) for o in error.validator_value]
        self.add(
            at,
            f"must be one of: {', '.join(options)}; got {describe_value(error.instance)}"
            + _suggest(error.instance, options),
        )

    def _on_const(self, error: ValidationError, at: YamlPath) -> None:
        self.add(at, f"must be {error.validator_value!r}; got {describe_value(error.instance)}")

    def _on_pattern(self, error: ValidationError, at: YamlPath) -> None:
        value, pattern = error.instance, error.validator_value
        supervisor = load_schema("spec")
        if isinstance(value, str) and any(c in value for c in "\r\n"):
            self.add(at, f"{value!r} contains a line break (names are one line)")
        elif pattern == supervisor["properties"]["id"]["pattern"]:
            lowered = value.lower()
            hint = (
                f" (did you mean '{lowered}'?)"
                if lowered != value and _ecma_regex(pattern).search(lowered)
                else ""
            )
            self.add(
                at,
                f"{value!r} is not a valid id{hint}: ids are lowercase letters, digits, '_' and '-', "
                f"at most 63 characters, no slashes (pattern {pattern})",
            )
        elif pattern == supervisor["$defs"]["duration"]["pattern"]:
            self.add(at, f"{value!r} is not a duration (use e.g. 500ms, 30s, 5m, 1h)")
        else:
            self.add(at, f"{value!r} does not match the pattern {pattern}")

    def _on_not(self, error: ValidationError, at: YamlPath) -> None:
        why = error.validator_value.get("description") if isinstance(error.validator_value, Mapping) else None
        self.add(at, f"{describe_value(error.instance)} is not allowed: {why}" if why else error.message)

    def _on_minimum(self, error: ValidationError, at: YamlPath) -> None:
        self.add(at, f"must be at least {error.validator_value}, got {error.instance}")

    def _on_maximum(self, error: ValidationError, at: YamlPath) -> None:
        self.add(at, f"must be at most {error.validator_value}, got {error.instance}")

    def _on_minLength(self, error: ValidationError, at: YamlPath) -> None:
        n = error.validator_value
        self.add(at, "must not be empty" if n == 1 else f"must be at least {n} characters long")

    def _on_maxLength(self, error: ValidationError, at: YamlPath) -> None:
        self.add(
            at, f"is too long: {len(error.instance)} characters, at most {error.validator_value}"
        )

    def _on_minItems(self, error: ValidationError, at: YamlPath) -> None:
        n = error.validator_value
        self.add(at, f"must list at least {n} item{'s' if n != 1 else ''}")

    def _on_minProperties(self, error: ValidationError, at: YamlPath) -> None:
        n = error.validator_value
        self.add(at, f"must have at least {n} entr{'ies' if n != 1 else 'y'}")

    def _on_uniqueItems(self, error: ValidationError, at: YamlPath) -> None:
        seen: list[Any] = []
        repeated = None
        for item in error.instance:
            if item in seen:
                repeated = item
                break
            seen.append(item)
        self.add(at, f"items must be unique ({describe_value(repeated)} appears more than once)")

    def _on_anyOf(self, error: ValidationError, at: YamlPath) -> None:
        """``anyOf`` of ``required`` branches (``lagPolicy``: maxRecords and/or maxLag)."""
        keys = [k for b in error.validator_value for k in (b.get("required") or [])]
        if isinstance(error.instance, Mapping) and keys and all(set(b) == {"required"} for b in error.validator_value):
            self.add(at, f"needs at least one of: {', '.join(keys)}", key=bool(at))
            return
        self.add(at, error.message)

    def _on_oneOf(self, error: ValidationError, at: YamlPath) -> None:
        branches = [_resolve(b) for b in error.validator_value]
        by_branch: dict[int, list[ValidationError]] = {}
        for sub in error.context:
            by_branch.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
        if not error.context:
            self.add(at, f"matches more than one of: {_forms(branches)}")
            return
        chosen = self._choose_branch(error.instance, branches, at)
        if chosen is None:
            return
        if chosen >= 0 and by_branch.get(chosen):
            for sub in by_branch[chosen]:
                self.translate(sub)
            return
        self.add(
            at,
            f"must be one of: {_forms(branches)}; got {describe_value(error.instance)}"
            + _suggest(error.instance, _enum_values(branches)),
        )

    def _choose_branch(
        self, instance: Any, branches: list[Mapping[str, Any]], at: YamlPath
    ) -> int | None:
        """The branch the user evidently meant; -1 for none; None when already reported."""
        kinds = [_discriminator(b) for b in branches]
        if all(k is not None for k in kinds):  # tagged union, e.g. source.type
            if not isinstance(instance, Mapping):
                return -1
            options = [str(k) for k in kinds]
            if "type" not in instance:
                self.add(
                    at, f"missing required key 'type' (one of: {', '.join(options)})", key=True
                )
                return None
            if instance["type"] in kinds:
                return kinds.index(instance["type"])
            self.add(
                (*at, "type"),
                f"must be one of: {', '.join(options)}; got "
                f"{describe_value(instance['type'])}" + _suggest(instance["type"], options),
            )
            return None
        if not isinstance(instance, Mapping):
            return -1
        for i, branch in enumerate(branches):
            required = branch.get("required") or []
            if required and all(k in instance for k in required):
                return i
        known = sorted({k for b in branches for k in b.get("properties", {})})
        unknown = [k for k in instance if k not in known]
        for key in unknown:
            self._unknown_key(
                at, str(key), known, f"unknown key; must be one of: {_forms(branches)}"
            )
        return None if unknown else -1


def unknown_key_message(key: str, allowed: list[str]) -> str:
    """``unknown key (did you mean 'topic'?)``, or the allowed keys when none is close."""
    suggestion = closest(key, allowed)
    if suggestion:
        return f"unknown key (did you mean '{suggestion}'?)"
    if not allowed:
        return "unknown key (no keys are allowed here)"
    return f"unknown key (allowed: {', '.join(allowed)})"


def closest(word: str, options: Iterable[str]) -> str | None:
    """The option ``word`` is most likely a typo of, if any is close enough."""
    found = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    if not found:
        found = [o for o in options if o.lower() == word.lower()]
    return found[0] if found else None


def describe_value(value: Any) -> str:
    """``string '2x'``, ``integer 5``, ``a mapping``: how a wrong value is named."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"string {shown!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _problem(
    parsed: ParsedYaml, where: tuple[int | None, int | None], at: YamlPath, message: str
) -> SpecProblem:
    return SpecProblem(parsed.path, where[0], where[1], format_field(at), message)


def _suggest(value: Any, options: list[str]) -> str:
    if not isinstance(value, str) or not options:
        return ""
    match = closest(value, options)
    return f" (did you mean '{match}'?)" if match and match != value else ""


@functools.cache
def _resolver() -> Any:
    return schema_registry().resolver(base_uri=load_schema("spec")["$id"])


def _resolve(schema: Any) -> Mapping[str, Any]:
    """A ``oneOf`` branch with its ``$ref`` followed (refs in both schemas point into the spec schema)."""
    while isinstance(schema, Mapping) and "$ref" in schema:
        schema = _resolver().lookup(schema["$ref"]).contents
    return schema if isinstance(schema, Mapping) else {}


def _discriminator(branch: Mapping[str, Any]) -> Any:
    prop = branch.get("properties", {}).get("type", {})
    return prop.get("const") if isinstance(prop, Mapping) else None


def _enum_values(branches: list[Mapping[str, Any]]) -> list[str]:
    return [str(v) for b in branches for v in b.get("enum", [])]


def _forms(branches: list[Mapping[str, Any]]) -> str:
    """``earliest, latest, {timestamp: ...}, {offsets: {...}}, {shiftBy: N}``."""
    forms: list[str] = []
    for branch in branches:
        if "enum" in branch:
            forms.extend(str(v) for v in branch["enum"])
        elif _discriminator(branch) is not None:
            forms.append(f"{{type: {_discriminator(branch)}, ...}}")
        elif branch.get("required"):
            key = branch["required"][0]
            prop_type = branch.get("properties", {}).get(key, {}).get("type")
            placeholder = {"integer": "N", "object": "{...}"}.get(prop_type, "...")
            forms.append(f"{{{key}: {placeholder}}}")
    return ", ".join(forms)


def _get(data: Any, at: YamlPath) -> Any:
    for part in at:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
        else:
            return None
    return data


def _within(field: str, at: YamlPath) -> bool:
    """Whether a problem's field is ``at`` or one of its ancestors or descendants."""
    target = format_field(at)
    return field == target or target.startswith(field + ".") or field.startswith(target + ".")
