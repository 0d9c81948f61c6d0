"""The one slug helper (graft.naming.slug), used for workspace folders and figure names."""

from __future__ import annotations

from graft.naming import slug


def test_slug_keeps_safe_characters_and_replaces_the_rest():
    assert slug("org/model v2") == "org-model-v2"
    assert slug("smollm2-135m_v1.0") == "smollm2-135m_v1.0"
    assert slug("o,ffn") == "o-ffn"  # the layers figure of the o,ffn group
    assert slug("..hidden/") == "hidden"  # no leading dot: never a hidden folder
    assert slug("///") == "x" and slug("") == "x"
