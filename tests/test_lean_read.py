"""A leaner worker (issue 39 §2): partition files are streamed straight into their final tensors
(shared memory where GLT keeps them), still checked against the manifest, and the edges are
stored in compressed order so GLT gets its CSR without sorting again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from components import storage
from components.errors import GnnflowError
from components.gnn.glt_dataset import read_for_worker, to_dist_dataset
from components.gnn.glt_topology import glt_topology
from components.partition import tensor_read
from components.partition.output import read_partition
from components.partition.store import read_tensors, write_tensors
from components.partition.tensor_read import SHARED, Want
from components.runtime.collectives import exchange

EDGES = "paper__cites__paper"


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return {
        "f32": torch.randn(301, 7, generator=generator),
        "f16": torch.randn(64, 3, generator=generator).to(torch.float16),
        "bf16": torch.randn(50, generator=generator).to(torch.bfloat16),
        "i8": torch.randint(-128, 128, (999,), dtype=torch.int8, generator=generator),
        "i64": torch.randint(-(2**40), 2**40, (2, 1201), generator=generator),
        "flags": torch.rand(77, generator=generator) > 0.5,
        "none": torch.zeros((0, 5)),
    }


def _publish(root: storage.Uri, files: dict[str, bytes]) -> storage.PublishedOutput:
    with storage.staged_output(root, "partition") as staging:
        for relative, data in files.items():
            staging.write_bytes(relative, data)
        return staging.publish()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def test_the_streamed_read_gives_the_tensors_safetensors_loads_bit_for_bit(root: storage.Uri, monkeypatch) -> None:
    monkeypatch.setattr(tensor_read, "CHUNK_BYTES", 1000)  # many chunks per tensor, boundaries inside elements
    data = save_safetensors(_tensors())
    published = _publish(root.join("out"), {"t.safetensors": data})
    expected = load_safetensors(data)

    whole = read_tensors(published, "t.safetensors")
    assert set(whole) == set(expected) and all(_same_bits(whole[k], expected[k]) for k in expected)
    assert not any(t.is_shared() for t in whole.values())

    picked = read_tensors(published, "t.safetensors", {"f32": SHARED, "i64": Want(shared=True, row=1), "i8": None, "bf16": None})
    assert set(picked) == set(expected) - {"i8", "bf16"}
    assert picked["f32"].is_shared() and _same_bits(picked["f32"], expected["f32"])
    assert picked["i64"].is_shared() and _same_bits(picked["i64"], expected["i64"][1].contiguous())
    assert _same_bits(picked["flags"], expected["flags"]) and picked["none"].shape == (0, 5)


def test_the_streamed_writer_gives_a_file_safetensors_loads_bit_for_bit_with_the_manifests_checksum(root: storage.Uri, monkeypatch) -> None:
    """Partition files are written a bounded chunk at a time (no whole-file bytes object); the
    result is a safetensors file like any other, and its manifest entry is the bytes' own."""
    import components.partition.store as store

    monkeypatch.setattr(store, "_WRITE_CHUNK", 1000)  # many writes per tensor
    tensors = _tensors()
    with storage.staged_output(root.join("streamed"), "partition") as staging:
        with staging.open_write("t.safetensors") as stream:
            write_tensors(stream, tensors)
        published = staging.publish()
    data = storage.read_bytes(published.uri("t.safetensors"))
    loaded = load_safetensors(data)
    assert set(loaded) == set(tensors) and all(_same_bits(loaded[k], tensors[k]) for k in tensors)
    assert published.manifest.files["t.safetensors"] == storage.FileEntry.of(data)
    assert int.from_bytes(data[:8], "little") % 8 == 0  # the data section starts 8-byte aligned
    streamed = read_tensors(published, "t.safetensors")  # the workers' reader, checked against the manifest
    assert all(_same_bits(streamed[k], tensors[k]) for k in tensors)


def test_a_consuming_exchange_takes_each_column_out_and_moves_the_same_rows() -> None:
    """One process (no peers): the rows come back in destination order either way; consume=True
    leaves the caller's dict empty, so a column's memory can go before the next one is sent."""
    rows = {"a": torch.arange(10), "b": torch.arange(10, 20).to(torch.int8)}
    destination = torch.zeros(10, dtype=torch.int64)
    kept = exchange(dict(rows), destination, 1)
    consumed_from = dict(rows)
    consumed = exchange(consumed_from, destination, 1, consume=True)
    assert consumed_from == {}
    assert all(torch.equal(kept[k], consumed[k]) and torch.equal(kept[k], rows[k]) for k in rows)


def test_a_flipped_byte_is_refused_even_in_a_tensor_the_read_does_not_keep(root: storage.Uri) -> None:
    tensors = _tensors()
    data = save_safetensors(tensors)
    published = _publish(root.join("out"), {"t.safetensors": data})
    header = 8 + int.from_bytes(data[:8], "little")
    start, _ = re.search(rb'"i8":\{[^}]*"data_offsets":\[(\d+),(\d+)\]', data[:header]).groups()  # type: ignore[union-attr]
    damaged = [header + int(start) + 10, 20]  # inside i8's bytes (not kept below); inside the JSON header
    for at in damaged:
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        storage.write_bytes(published.uri("t.safetensors"), bytes(flipped))
        with pytest.raises(storage.DamagedFile, match=r"t\.safetensors is damaged: its CRC32C is [0-9a-f]{8}, its manifest"):
            read_tensors(published, "t.safetensors", {"i8": None})
    storage.write_bytes(published.uri("t.safetensors"), data[:-3])  # short: named by its size
    with pytest.raises(storage.DamagedFile, match=r"t\.safetensors is damaged: it has only \d+ bytes"):
        read_tensors(published, "t.safetensors")


def test_a_file_that_is_no_safetensors_is_refused_in_one_line(tmp_path: Path) -> None:
    published = _publish(storage.parse_uri(str(tmp_path / "out")), {"t.safetensors": b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}"})
    with pytest.raises(GnnflowError, match=r"t\.safetensors is not a safetensors file gnnflow can read .*: re-run partition$"):
        read_tensors(published, "t.safetensors")


def test_stored_edges_are_in_compressed_order_with_their_row_pointer(one_sided_validation) -> None:
    _, partitions, _ = one_sided_validation
    published = storage.open_published(partitions)
    for index in range(2):
        part = read_partition(published, index)
        assert part.metadata.edge_assignment == "src"
        edges, first = part.edges[EDGES], part.node_offset("paper")
        src, dst = edges["edge_index"]
        key = (src - first) * int(dst.max() + 1) + dst
        assert bool((key[1:] >= key[:-1]).all()) and len(src) > 100
        owned = part.metadata.node_counts["paper"][index]
        assert torch.equal(edges["indptr"][1:] - edges["indptr"][:-1], torch.bincount(src - first, minlength=owned))
        assert torch.equal(edges["edge_id"], torch.arange(part.edge_offset(EDGES), part.edge_offset(EDGES) + len(src)))


def test_the_lean_read_keeps_what_glt_keeps_the_same_bits_in_shared_memory(one_sided_validation) -> None:
    _, partitions, _ = one_sided_validation
    published = storage.open_published(partitions)
    for index in range(2):
        full, lean = read_partition(published, index), read_for_worker(published, index, sampled=True)
        for name, tensors in full.nodes.items():
            assert set(lean.nodes[name]) == set(tensors) and all(_same_bits(lean.nodes[name][k], t) for k, t in tensors.items())
            assert lean.nodes[name]["features"].is_shared() and not lean.nodes[name]["label"].is_shared()
        edges = lean.edges[EDGES]
        assert set(edges) == {"indptr", "indices", "features"}  # no edge features: no edge ids to look them up by
        assert _same_bits(edges["indices"], full.edges[EDGES]["edge_index"][1].contiguous()) and edges["indices"].is_shared()
        assert _same_bits(edges["indptr"], full.edges[EDGES]["indptr"])
        # Where a GPU graph mode copies the edge ids whole, the lean read's are made: the stored ones.
        first_owned, first_edge = lean.node_offset("paper"), lean.edge_offset(EDGES)
        made = glt_topology(edges, edge_dir="out", first_owned=first_owned, first_edge=first_edge).edge_ids
        assert _same_bits(made, full.edges[EDGES]["edge_id"]) and made.is_shared()


def _old_format_copy(partitions: storage.PublishedOutput, root: Path) -> storage.PublishedOutput:
    """The partitions as gnnflow wrote them before compressed order: edges in source edge id
    order, no ``indptr``."""
    files = {}
    for relative in partitions.manifest.files:
        data = partitions.read_bytes(relative)
        if "/edges/" in relative:
            tensors = load_safetensors(data)
            order = torch.argsort(tensors.pop("source_edge_id"))
            old = {k: v[order] for k, v in tensors.items() if k not in ("indptr", "edge_index", "edge_id")}
            old["edge_index"] = tensors["edge_index"][:, order].contiguous()
            old["source_edge_id"] = torch.sort(load_safetensors(data)["source_edge_id"]).values
            old["edge_id"] = tensors["edge_id"]  # offset + position, as before
            data = save_safetensors(old)
        files[relative] = data
    with storage.staged_output(storage.parse_uri(str(root)), "partition") as staging:
        for relative, data in files.items():
            staging.write_bytes(relative, data)
        return staging.publish(partitions.manifest.counts, partitions.manifest.metadata)


def _neighbourhoods(dataset, seeds: torch.Tensor, fan_outs: list[int]) -> list[torch.Tensor]:
    from graphlearn_torch.sampler import NeighborSampler, NodeSamplerInput

    sampler = NeighborSampler(dataset.graph, fan_outs, device=torch.device("cpu"), seed=7)
    out = sampler.sample_from_nodes(NodeSamplerInput(node=seeds))
    return [out.node, out.row, out.col]


def test_glt_samples_the_same_neighbourhoods_from_the_stored_csr_and_old_partitions_still_load(one_sided_validation, tmp_path) -> None:
    _, partitions, _ = one_sided_validation
    published = storage.open_published(partitions)
    old = _old_format_copy(published, tmp_path / "old")
    for index in range(2):
        old_part = read_for_worker(old, index, sampled=True)  # no indptr: read whole, GLT converts COO as before
        assert "edge_index" in old_part.edges[EDGES] and "indptr" not in old_part.edges[EDGES]
        before = to_dist_dataset(old_part)
        after = to_dist_dataset(read_for_worker(published, index, sampled=True))
        topo_before, topo_after = before.graph.topo, after.graph.topo
        assert torch.equal(topo_after.indices, topo_before.indices)
        rows = len(topo_before.indptr)  # GLT's own pointer ends at the largest source; ours at the last owned node
        assert torch.equal(topo_after.indptr[:rows], topo_before.indptr) and bool(
            (topo_after.indptr[rows:] == len(topo_after.indices)).all()
        )
        assert topo_after.indptr.is_shared() and topo_after.indices.is_shared()
        # No edge features: GLT's edge ids are a stand-in of the right length in 8 bytes.
        assert len(topo_after.edge_ids) == len(topo_after.indices) and topo_after.edge_ids.untyped_storage().nbytes() == 8
        seeds = read_partition(published, index).nodes["paper"]["node_id"]
        for fan_outs in ([-1], [-1, -1], [-1, -1, -1]):  # every neighbour: GLT's seeded draws differ from run to run
            got, want = _neighbourhoods(after, seeds, fan_outs), _neighbourhoods(before, seeds, fan_outs)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)) and len(got[0]) > len(seeds)


def test_a_filtered_csr_keeps_the_same_edges_as_glts_conversion(one_sided_validation, tmp_path) -> None:
    """Link prediction's message edges (a mask over the stored edges) from the stored order."""
    _, partitions, _ = one_sided_validation
    published = storage.open_published(partitions)
    old = _old_format_copy(published, tmp_path / "old")
    new_part, old_part = read_partition(published, 1), read_partition(old, 1)
    new_keep = torch.rand(len(new_part.edges[EDGES]["edge_id"]), generator=torch.Generator().manual_seed(1)) < 0.6
    # The same edges in the old order: matched by their source edge id.
    kept_ids = new_part.edges[EDGES]["source_edge_id"][new_keep]
    old_keep = torch.isin(old_part.edges[EDGES]["source_edge_id"], kept_ids)
    after = to_dist_dataset(new_part, edge_filter={EDGES: new_keep}).graph.topo
    before = to_dist_dataset(old_part, edge_filter={EDGES: old_keep}).graph.topo
    assert len(after.indices) == int(new_keep.sum()) < len(new_keep)
    assert torch.equal(after.indices, before.indices) and torch.equal(after.indptr[: len(before.indptr)], before.indptr)
    first_owned, first_edge = new_part.node_offset("paper"), new_part.edge_offset(EDGES)
    kept = glt_topology(new_part.edges[EDGES], edge_dir="out", first_owned=first_owned, first_edge=first_edge, keep=new_keep)
    assert kept.layout == "CSR" and torch.equal(kept.edge_ids, new_part.edges[EDGES]["edge_id"][new_keep]) and kept.edge_ids.is_shared()
