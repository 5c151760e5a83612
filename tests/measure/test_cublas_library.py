"""Which cuBLAS the baselines load: $GEMMGEN_CUBLAS_DIR, where set, is the only place looked in
(GPU-free; the version a GPU run records is tests/measure/test_gpu_measure.py's)."""

import pytest

from gemmgen.measure.cublas import CUBLAS_DIR_ENV, CublasError, library_version, load_cublas_library


def test_a_cublas_folder_without_the_library_is_refused_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv(CUBLAS_DIR_ENV, str(tmp_path))
    with pytest.raises(CublasError, match=r"GEMMGEN_CUBLAS_DIR=.* holds no libcublasLt\.so\*: name the folder"):
        load_cublas_library("libcublasLt.so*", "libcublasLt.so")


def test_a_cublas_folder_is_the_only_place_looked_in(tmp_path, monkeypatch):
    fake = tmp_path / "libcublas.so.13"
    fake.write_bytes(b"not a library")
    monkeypatch.setenv(CUBLAS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "toolkit"))
    with pytest.raises(CublasError) as err:
        load_cublas_library("libcublas.so*", "libcublas.so")
    tried = str(err.value).split("tried: ", 1)[1]
    assert tried.startswith(f"{fake}: ") and "; " not in tried  # that file alone, not the toolkit's nor the loader's


def test_a_library_without_the_version_call_is_a_cublas_error():
    """(bench records no version then, rather than stopping: Bench._cublas_kernel_id)"""
    class NoCalls:
        _name = "libfake.so"

    with pytest.raises(CublasError, match="libfake.so has no cublasGetProperty"):
        library_version(NoCalls())
