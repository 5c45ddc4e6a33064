"""loader.format.torch_archive: the tensors of a torch.save file, read without torch, equal torch's own load;
anything that is not tensors and containers is refused in one line, before it can run."""

import io
import pickle
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.torch_archive import read_tensors
from proto.errors import UserError

DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float64, torch.float32,
          torch.float16]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=3), st.sampled_from(DTYPES), st.booleans(),
       st.integers(0, 2**31))
def test_tensors_read_back_as_torch_loads_them(shape, dtype, transpose, seed):
    generator = torch.Generator().manual_seed(seed)
    tensor = (torch.rand(shape, generator=generator) * 100).to(dtype)
    if transpose and tensor.dim() > 1:
        tensor = tensor.transpose(0, -1)  # a view with strides of its own: read with them
    buffer = io.BytesIO()
    torch.save({"edge": tensor, "parts": [tensor[:1], (tensor,)], "n": 3}, buffer)
    path = _write(buffer.getvalue())
    read = read_tensors(path)
    assert read["n"] == 3 and isinstance(read["parts"], list)
    for got in (read["edge"], read["parts"][1][0]):
        assert got.dtype == tensor.numpy().dtype and got.shape == tuple(tensor.shape)
        np.testing.assert_array_equal(got, tensor.numpy())
    np.testing.assert_array_equal(read["parts"][0], tensor[:1].numpy())


def _write(data: bytes, name: str = "t.pt"):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / name
    path.write_bytes(data)
    return path


class _Evil:
    def __reduce__(self):
        import os
        return (os.system, ("echo pwned",))


def test_a_pickle_naming_anything_else_is_refused(tmp_path):
    buffer = io.BytesIO()
    torch.save({"edge": torch.arange(4)}, buffer)
    archive = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = tmp_path / "evil.pt"
    with zipfile.ZipFile(out, "w") as evil:
        for item in archive.namelist():
            data = archive.read(item)
            if item.endswith("data.pkl"):
                data = pickle.dumps({"edge": _Evil()}, protocol=2)
            evil.writestr(item, data)
    with pytest.raises(UserError, match="cannot read its tensors: it names posix.system"):
        read_tensors(out)


@pytest.mark.parametrize("content, fragment", [
    (b"\x80\x02}q\x00.", "not a torch.save zip archive"),  # a legacy (torch < 1.6) file: a bare pickle
    (None, "no such file"),
])
def test_what_is_not_a_torch_archive_is_refused(tmp_path, content, fragment):
    path = tmp_path / "x.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=fragment):
        read_tensors(path)
