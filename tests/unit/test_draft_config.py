"""A draft folder's config.json as `pull`/`import` read it (models/torch_draft.py): bounded, and any
malformed one is a LocalspecError naming the file, never another exception."""
import pytest

from localspec.models.errors import LocalspecError
from localspec.models.safetensors_file import MAX_CONFIG
from localspec.models.torch_draft import config_vocab_size


def test_a_plain_config_gives_its_vocabulary():
    assert config_vocab_size(b'{"vocab_size": 512}', "d/config.json") == 512


@pytest.mark.parametrize("raw", [
    b"not json", b"[1, 2]", b'{"vocab_size": "many"}', b"{}", b"\xff\xfe",
    b"[" * 100_000 + b"]" * 100_000,                       # nested past Python's recursion limit
    b'{"vocab_size": 512, "pad": "' + b"x" * MAX_CONFIG + b'"}',   # larger than any config
], ids=["text", "a list", "not a number", "no vocab_size", "not utf-8", "deep", "huge"])
def test_a_malformed_config_is_refused_naming_the_file(raw):
    with pytest.raises(LocalspecError, match="config.json is unusable") as err:
        config_vocab_size(raw, "d/config.json")
    assert "d/config.json" in err.value.cause
