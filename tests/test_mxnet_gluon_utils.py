"""mixrt.gluon.utils (MXNet 1.9.1's gluon.utils) and Context.default_ctx."""

import hashlib
import warnings

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import nd
from mixrt.errors import ExecutionError, InputError
from mixrt.gluon import utils


def test_split_data_even_and_uneven():
    data = nd.array(np.arange(20).reshape(10, 2))
    parts = utils.split_data(data, 5)
    assert [p.shape for p in parts] == [(2, 2)] * 5
    np.testing.assert_array_equal(parts[4].asnumpy(), [[16, 17], [18, 19]])
    parts = utils.split_data(data, 3, even_split=False)  # NumPy's array_split, as MXNet 1.9.1
    assert [p.shape[0] for p in parts] == [4, 3, 3]
    assert [p.shape[1] for p in utils.split_data(nd.ones((2, 33)), 4, 1, False)] == [9, 8, 8, 8]
    with pytest.raises(ValueError):  # MXNet's type
        utils.split_data(nd.ones((2, 33)), 4, batch_axis=1)
    parts = utils.split_data(data, 2, batch_axis=1)
    np.testing.assert_array_equal(parts[1].asnumpy().ravel(), np.arange(1, 20, 2))
    # fewer rows than parts: the parts past the rows are empty, as in MXNet
    parts = utils.split_data(nd.ones((2, 3)), 4, even_split=False)
    assert [p.shape for p in parts] == [(1, 3), (1, 3), (0, 3), (0, 3)]


def test_split_data_refuses_what_does_not_split():
    with pytest.raises(InputError, match="evenly"):
        utils.split_data(nd.ones((10, 2)), 3)
    with pytest.raises(InputError, match="ctx_list is empty"):
        utils.split_and_load(nd.ones((2, 2)), [])


def test_split_and_load_numpy_to_contexts():
    parts = utils.split_and_load(np.ones((4, 3)), [mixrt.cpu(0), mixrt.cpu(1)])
    assert [p.shape for p in parts] == [(2, 3), (2, 3)]
    assert [p.ctx for p in parts] == [mixrt.cpu(0), mixrt.cpu(1)]
    assert utils.split_and_load(nd.ones((3,)), [mixrt.cpu()])[0].shape == (3,)


def test_clip_global_norm_scales_in_place():
    a, b = nd.array([3.0, 0.0]), nd.array([[4.0]])
    norm = utils.clip_global_norm([a, b], 1.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(a.asnumpy(), [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(b.asnumpy(), [[0.8]], rtol=1e-6)
    small = nd.array([0.1, 0.2])
    total = utils.clip_global_norm([small], 10.0, check_isfinite=False)
    assert isinstance(total, nd.NDArray)
    np.testing.assert_allclose(small.asnumpy(), [0.1, 0.2], rtol=1e-6)


def test_clip_global_norm_warns_on_nan():
    with pytest.warns(UserWarning, match="nan or inf"):
        utils.clip_global_norm([nd.array([np.nan, 1.0])], 1.0)


def test_download_file_url_and_sha1(tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"\x00mixrt" * 1000)
    digest = hashlib.sha1(source.read_bytes()).hexdigest()
    target = tmp_path / "out"
    target.mkdir()
    path = utils.download(source.as_uri(), path=str(target), sha1_hash=digest)
    assert path == str(target / "weights.bin")
    assert utils.check_sha1(path, digest) and not utils.check_sha1(path, "0" * 40)
    assert sorted(p.name for p in target.iterdir()) == ["weights.bin"]  # no partial files
    with pytest.raises(ExecutionError, match="SHA-1"):
        utils.download(source.as_uri(), path=str(target / "copy"), sha1_hash="0" * 40,
                       retries=0)


def test_download_failures_are_typed(tmp_path):
    with pytest.raises(ExecutionError, match="after 2 tries"):
        utils.download((tmp_path / "missing").as_uri(), path=str(tmp_path / "x"),
                       retries=1)
    with pytest.raises(InputError, match="retries"):
        utils.download("file:///x", path=str(tmp_path / "x"), retries=-1)
    with pytest.raises(InputError, match="not an http"):
        utils.download("ftp://host/file", path=str(tmp_path / "y"), retries=0)


def test_repo_url_and_brief_list(monkeypatch):
    monkeypatch.setenv("MXNET_GLUON_REPO", "https://example.org/repo")
    assert utils._get_repo_url() == "https://example.org/repo/"
    assert utils._get_repo_file_url("models", "a.zip") == "https://example.org/repo/models/a.zip"
    assert utils._brief_print_list(["a", "b"]) == "'a', 'b'"
    assert utils._brief_print_list(range(10)) == "'0', '1', '2', ..., '6', '7', '8', '9'"


def test_context_default_ctx_is_the_current_context():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert mixrt.Context.default_ctx == mixrt.cpu()
        with mixrt.cpu(3):
            assert mixrt.Context.default_ctx == mixrt.cpu(3)
    with pytest.warns(DeprecationWarning):
        mixrt.Context.default_ctx  # noqa: B018


def test_shape_is_known_and_replace_file(tmp_path):
    assert utils.shape_is_known((2, 3)) and not utils.shape_is_known((2, 0))
    assert not utils.shape_is_known(None) and not utils.shape_is_known(())
    with pytest.raises(InputError, match="negative"):
        utils.shape_is_known((2, -3))
    (tmp_path / "a").write_text("new")
    (tmp_path / "b").write_text("old")
    utils.replace_file(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (tmp_path / "b").read_text() == "new" and not (tmp_path / "a").exists()
