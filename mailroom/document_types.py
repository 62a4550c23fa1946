"""Document types and their required fields (``recognition.document_types`` in settings).

``required`` lists rules: a name is a field that must be present; a list of
names is met when at least one of them is present (an investor name or a
customer id). ``field_types`` names the type of a field's value (``number``,
``integer``, ``date``, ``boolean``, ``text``): an operator's correction is parsed
into it, and refused when it does not parse. A field is present when it has a value other than null or "".
A rule not met is reported as its label: ``"amount"`` or ``"investor_name|customer_id"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: One rule: a field name, or names of which at least one must be present.
RequiredRule = str | list[str]

#: The type of a field's value: JSON numbers and booleans, ISO dates (``2030-01-31``), text.
FieldType = Literal["text", "number", "integer", "date", "boolean"]

#: Field names are short identifiers; longer text is a mistake in the settings.
MAX_FIELD_NAME_CHARS = 100


class DocumentType(BaseModel):
    """One document type: the fields a document of it must carry."""

    model_config = ConfigDict(extra="forbid")

    #: ``["amount", ["investor_name", "customer_id"]]``: amount, and one of the two names.
    required: list[RequiredRule] = []
    #: ``{"amount": "number", "due": "date"}``: what a corrected value is parsed into.
    field_types: dict[str, FieldType] = Field(default_factory=dict, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _check_rules(cls, data: Any) -> Any:
        """Take the older key ``required_fields``; one clear line for a malformed rule."""
        if not isinstance(data, dict):
            return data
        if "required_fields" in data:
            if "required" in data:
                raise ValueError("give required or required_fields (its older name), not both")
            data = {**data, "required": data["required_fields"]}
            del data["required_fields"]
        rules = data.get("required", [])
        if not isinstance(rules, list):
            raise ValueError(f"required must be a list of field names, got {_shown(rules)}")
        for index, rule in enumerate(rules):
            problem = _rule_problem(rule)
            if problem:
                raise ValueError(f"required[{index}] {problem}")
        return data

    def missing(self, fields: Mapping[str, Any]) -> list[str]:
        """Labels of the rules ``fields`` (name -> value) does not meet, in settings order."""
        return [
            label(rule)
            for rule in self.required
            if not any(_present(fields, name) for name in _names(rule))
        ]

    def labels(self) -> list[str]:
        """Every rule as shown to people: ``["investor_name|customer_id", "amount"]``."""
        return [label(rule) for rule in self.required]


def label(rule: RequiredRule) -> str:
    return "|".join(_names(rule))


def _names(rule: RequiredRule) -> list[str]:
    return [rule] if isinstance(rule, str) else rule


def _present(fields: Mapping[str, Any], name: str) -> bool:
    return fields.get(name) not in (None, "")


def _rule_problem(rule: Any) -> str | None:
    """Why ``rule`` is not a field name or a list of at least one name; None when it is."""
    names = [rule] if isinstance(rule, str) else rule
    if not isinstance(names, list) or not names:
        return f"must be a field name or a non-empty list of names, got {_shown(rule)}"
    for name in names:
        if not isinstance(name, str) or not name.strip():
            return f"has {_shown(name)}, not a field name"
        if len(name) > MAX_FIELD_NAME_CHARS or "|" in name:
            return f"has {_shown(name)}: a field name has no '|' and at most 100 characters"
    if len(set(names)) != len(names):
        return f"names a field twice: {_shown(rule)}"
    return None


def _shown(value: Any) -> str:
    rendered = repr(value)
    return rendered if len(rendered) <= 60 else rendered[:57] + "..."
