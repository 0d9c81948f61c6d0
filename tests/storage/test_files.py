"""graft.storage.files: files others can read, as the umask says."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from graft.storage.files import current_umask, share_like_umask


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_umask_is_read_without_changing_it(umask_022):
    assert current_umask() == 0o022
    assert current_umask() == 0o022


def test_a_weights_file_written_0600_becomes_readable_by_others(tmp_path, umask_022):
    folder = tmp_path / "donor"
    (folder / "sub").mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    (folder / "sub" / "config.json").write_text("{}")
    (folder / "link").symlink_to(folder / "model.safetensors")
    # the writer's own mode, whatever the umask: what a second user could not read
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o600
    folder.chmod(0o700)  # as tempfile.mkdtemp makes it
    share_like_umask(folder)
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (folder / "sub" / "config.json").stat().st_mode & 0o777 == 0o644
    assert folder.stat().st_mode & 0o777 == 0o755
    os.umask(0o077)  # a private workspace stays private
    share_like_umask(folder)
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o600
