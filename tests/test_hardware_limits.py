"""The machine limits the speed benchmarks read numbers against (real_fae_core/hardware.py)."""

from __future__ import annotations

from real_fae_core.hardware import last_level_cache_bytes, matmul_peak_gflops, memory_read_gbs


def _cache_dir(tmp_path, entries):
    for name, (level, size) in entries.items():
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    return str(tmp_path)


def test_the_last_level_cache_is_the_highest_level_whatever_the_index_order(tmp_path):
    root = _cache_dir(tmp_path, {"index0": (1, "48K"), "index1": (1, "32K"), "index3": (3, "300M"),
                                 "index2": (2, "2048K")})
    assert last_level_cache_bytes(root) == 300 << 20
    assert last_level_cache_bytes(str(tmp_path / "missing")) is None


def test_a_cache_entry_the_kernel_reports_oddly_is_passed_over(tmp_path):
    root = _cache_dir(tmp_path, {"index0": (2, "1024K")})
    (tmp_path / "index1").mkdir()
    (tmp_path / "index1" / "level").write_text("three\n")
    assert last_level_cache_bytes(root) == 1 << 20


def test_read_rate_and_matmul_peak_are_plausible_numbers():
    """A read of 64 MiB and a small matmul: positive, finite, and the read not beyond any memory's reach."""
    rate = memory_read_gbs(64 << 20, repeats=2)
    assert 0.1 < rate < 10_000
    assert 0 < matmul_peak_gflops("fp32", n=128, repeats=2) < 1e6
