"""Values written for Helm and Argo CD keep number-like strings strings."""

from __future__ import annotations

import yaml

from fibers_stack import yamlout


def test_an_all_digit_image_tag_stays_a_string_with_its_leading_zero() -> None:
    """PyYAML wrote `tag: 067782716894` plain (not a number to its own resolver); Helm read the number
    67782716894 and the chart's schema refused jobs.image.tag: CI's README install and Argo CD tests failed."""
    values = {"jobs": {"image": {"tag": "067782716894", "digest": "sha256:ab"}}, "n": 3, "v": "1.5", "w": "abc"}
    text = yamlout.dump(values, sort_keys=False)
    assert "tag: '067782716894'" in text and "v: '1.5'" in text and "w: abc" in text and "n: 3" in text
    assert yaml.safe_load(text) == values
