"""node.gpus: which GPUs a node offers, and a pool of mixed models refused (pure; no GPU needed)."""
from __future__ import annotations

import pytest

from cutile_perf.errors import EXIT_USAGE, UsageError
from cutile_perf.node.gpus import UNKNOWN, Gpu, discover, parse_smi, pick, require_one_model

H100_X2 = ("0, NVIDIA H100 80GB HBM3, GPU-aaaa\n"
           "1, NVIDIA H100 80GB HBM3, GPU-bbbb\n")
MIXED = H100_X2 + "2, NVIDIA A100-SXM4-80GB, GPU-cccc\n"


def test_parse_smi_reads_index_name_uuid_and_skips_warnings():
    text = "WARNING: persistence mode is off\n" + H100_X2
    assert parse_smi(text) == [Gpu("0", "NVIDIA H100 80GB HBM3", "GPU-aaaa"), Gpu("1", "NVIDIA H100 80GB HBM3", "GPU-bbbb")]


def test_without_cuda_visible_devices_every_listed_gpu_is_offered():
    assert [g.device for g in discover(None, MIXED)] == ["0", "1", "2"]


def test_cuda_visible_devices_chooses_by_index_or_uuid_and_names_from_the_listing():
    found = discover("2,GPU-aaaa", MIXED)
    assert [(g.device, g.name) for g in found] == [("2", "NVIDIA A100-SXM4-80GB"), ("GPU-aaaa", "NVIDIA H100 80GB HBM3")]


@pytest.mark.parametrize("visible", ["", "-1", "-1,0"])
def test_an_empty_or_invalid_first_cuda_visible_devices_entry_offers_no_gpu(visible):
    # CUDA stops at the first invalid entry: "-1,0" hides every GPU, as CUDA does.
    assert discover(visible, H100_X2) == []


def test_a_visible_gpu_nvidia_smi_does_not_list_is_unknown():
    assert discover("7", H100_X2) == [Gpu("7", UNKNOWN)]


def test_mixed_models_are_refused_with_one_line_naming_them():
    with pytest.raises(UsageError) as err:
        require_one_model(discover(None, MIXED))
    assert err.value.exit_code == EXIT_USAGE
    message = str(err.value).splitlines()[0]
    assert "NVIDIA A100-SXM4-80GB" in message and "NVIDIA H100 80GB HBM3" in message and "2 models" in message


def test_one_model_passes():
    require_one_model(discover(None, H100_X2))


def test_pick_all_refuses_a_mixed_node_but_a_count_of_one_model_passes():
    with pytest.raises(UsageError, match="models"):
        pick(discover(None, MIXED), "all")
    assert [g.device for g in pick(discover(None, MIXED), "2")] == ["0", "1"]


@pytest.mark.parametrize("wanted, why", [("3", "offers 2"), ("0", "at least 1"), ("two", "at least 1")])
def test_pick_refuses_a_count_the_node_cannot_give(wanted, why):
    with pytest.raises(UsageError, match=why):
        pick(discover(None, H100_X2), wanted)


def test_a_machine_without_gpu_gets_one_cpu_worker():
    assert pick([], "1") == pick([], "all") == [Gpu("", "cpu")]
