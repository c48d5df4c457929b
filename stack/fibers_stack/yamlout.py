"""YAML for Helm and Argo CD to read: strings that Go's YAML reads as numbers are quoted.

PyYAML quotes a string only where its own YAML 1.1 resolver would read a number. `067782716894` (a content-hash
image tag that happens to be all digits) is neither octal nor decimal to it, so it went out plain — and Helm
and Argo CD read it as the number 67782716894: the chart's schema refused `jobs.image.tag` ("got number, want
string") and the tag had lost its leading zero.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_NUMBER_LIKE = re.compile(r"[-+]?[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?|[-+]?\.[0-9]+([eE][-+]?[0-9]+)?")


class _Dumper(yaml.SafeDumper):
    pass


def _string(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "'" if _NUMBER_LIKE.fullmatch(data) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _string)


def dump(doc: Any, **options: Any) -> str:
    """yaml.safe_dump, with number-like strings quoted."""
    text: str = yaml.dump(doc, Dumper=_Dumper, **options)
    return text
