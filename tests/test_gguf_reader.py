"""GGUF reader: valid files against gguf-py (the oracle), and one clear SterError for every
kind of broken file (crafted byte by byte with gguf_craft), plus a bounded fuzz test."""
import os
import struct

import gguf
import numpy as np
import pytest
from gguf_craft import (ARRAY, BOOL, F32, F64, I8, I16, I32, I64, STRING, U8, U16, U32, U64, Craft, gstring,
                        small_valid_file)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ster_py.errors import SterError
from ster_py.gguf import quants
from ster_py.gguf.reader import GGUFFile, open_gguf
from tiny import gguf_py_reader

Q8_0, Q4_K, IQ2_XXS, TQ1_0 = 8, 12, 16, 34


def write(tmp_path, data: bytes, name="f.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def refused(tmp_path, data: bytes, *fragments: str) -> str:
    """Open ``data`` and require exactly a SterError whose message holds every fragment."""
    with pytest.raises(SterError) as e:
        GGUFFile(write(tmp_path, data))
    msg = str(e.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


def one_q8_tensor(c: Craft, name="w", rows=2, offset=None) -> Craft:
    return c.add_tensor(name, bytes(34 * rows), (32, rows), Q8_0, offset=offset)


# -- valid files ---------------------------------------------------------------------------

def test_small_crafted_file_all_value_types(tmp_path):
    data, expected = small_valid_file()
    f = open_gguf(write(tmp_path, data))
    m = f.metadata
    assert f.version == 3 and f.alignment == 32 and f.architecture == "llama"
    assert (m["test.u8"], m["test.i8"], m["test.u16"], m["test.i16"]) == (200, -100, 60000, -30000)
    assert (m["test.u32"], m["test.i32"]) == (4_000_000_000, -2_000_000_000)
    assert (m["test.u64"], m["test.i64"]) == (2**63 + 5, -(2**62))
    assert m["test.f32"] == 1.5 and m["test.f64"] == 0.1 and m["test.bool"] is True
    assert m["test.string"] == "héllo"
    assert m["test.arr_i16"].dtype == np.int16 and m["test.arr_i16"].tolist() == [1, -2, 3]
    assert m["test.arr_str"] == ["a", "", "ü"]
    nested = m["test.nested"]
    assert nested[0].dtype == np.uint8 and nested[0].tolist() == [1, 2] and nested[1] == ["x"]
    assert f.metadata_types["test.nested"] == "array of array"
    assert f.metadata_types["test.arr_str"] == "array of string"
    assert f.tensor_names() == ["a.weight", "b.weight", "c.weight"]
    a, b, c = (f.tensor(n) for n in f.tensor_names())
    assert (a.shape, a.dims, a.type_name) == ((2, 8), (8, 2), "F32")
    assert (b.shape, b.type_name, c.shape, c.type_name) == ((3, 4), "F16", (2, 32), "Q8_0")
    assert np.array_equal(a.dequantize(), expected["f32"]) and np.array_equal(b.dequantize(), expected["f16"])
    want_c = gguf.quants.dequantize(c.raw_rows, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(c.dequantize(), want_c)
    # The same file read by gguf-py: same tensor offsets and bytes.
    r = gguf.GGUFReader(write(tmp_path, data, "again.gguf"))
    for t in r.tensors:
        ours = f.tensor(t.name)
        assert f.data_offset + ours.offset == t.data_offset
        assert ours.raw.tobytes() == t.data.tobytes()


def test_version_2_is_read(tmp_path):
    data, _ = small_valid_file()
    v2 = data[:4] + struct.pack("<I", 2) + data[8:]
    f = GGUFFile(write(tmp_path, v2))
    assert f.version == 2 and f.metadata["test.string"] == "héllo"


def test_raw_is_a_read_only_view_of_the_map(tmp_path):
    data, _ = small_valid_file()
    f = GGUFFile(write(tmp_path, data))
    raw = f.tensor("c.weight").raw
    assert raw.dtype == np.uint8 and raw.size == 68
    assert not raw.flags.owndata and not raw.flags.writeable
    assert np.shares_memory(raw, f.tensor("c.weight").raw_rows)
    # Views stay valid after close (they keep the map alive).
    f.close()
    assert raw.tobytes() == data[len(data) - 68:]
    with pytest.raises(SterError, match="closed"):
        f.tensor("c.weight")


def test_gguf_py_writer_file_with_custom_alignment(tmp_path):
    """A file written by gguf-py's GGUFWriter (alignment 64, quantized tensors), read back."""
    path = str(tmp_path / "w.gguf")
    w = gguf.GGUFWriter(path, arch="qwen2")
    w.add_custom_alignment(64)
    w.add_block_count(3)
    w.add_uint64("qwen2.context_length", 2**40)
    w.add_float32("qwen2.rope.freq_base", 1e6)
    w.add_float64("test.f64", -2.5)
    w.add_int8("test.i8", -7)
    w.add_bool("test.bool", False)
    w.add_array("test.floats", [0.5, 1.5])
    w.add_key_value("test.u16s", [1, 65535], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT16)
    w.add_token_list(["<s>", "a", "ab"])
    w.add_token_scores([0.0, -1.0, -2.0])
    w.add_token_types([3, 1, 1])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    tensors = {
        "f32.weight": (x[0, :5], None),
        "q8.weight": (gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0),
        "q41.weight": (gguf.quants.quantize(x[:2], gguf.GGMLQuantizationType.Q4_1), gguf.GGMLQuantizationType.Q4_1),
    }
    for name, (arr, qt) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    f = GGUFFile(path)
    r = gguf.GGUFReader(path)
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert f.metadata["qwen2.block_count"] == 3 and f.metadata["qwen2.context_length"] == 2**40
    assert f.metadata["test.u16s"].dtype == np.uint16 and f.metadata["test.u16s"].tolist() == [1, 65535]
    assert f.metadata["tokenizer.ggml.tokens"] == ["<s>", "a", "ab"]
    assert f.metadata["test.bool"] is False and f.metadata["test.i8"] == -7
    _same_as_gguf_py(f, r)
    assert np.array_equal(f.tensor("f32.weight").dequantize(), x[0, :5])


def _same_as_gguf_py(f: GGUFFile, r: gguf.GGUFReader) -> None:
    """Every key, value and type, and every tensor's name, shape, type, offset and bytes."""
    fields = {k: v for k, v in r.fields.items() if not k.startswith("GGUF.")}
    assert list(f.metadata) == list(fields)
    for key, field in fields.items():
        theirs = field.contents()
        ours = f.metadata[key]
        want_type = gguf.GGUFValueType(field.types[0]).name.lower()
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            want_type = f"array of {gguf.GGUFValueType(field.types[-1]).name.lower()}"
        assert f.metadata_types[key] == want_type, key
        if isinstance(ours, np.ndarray):
            assert ours.tolist() == list(theirs), key
        else:
            assert ours == theirs, key
    assert f.tensor_names() == [t.name for t in r.tensors]
    for t in r.tensors:
        ours = f.tensor(t.name)
        assert list(ours.dims) == [int(d) for d in t.shape], t.name
        assert ours.ggml_type == int(t.tensor_type) and ours.type_name == t.tensor_type.name
        assert f.data_offset + ours.offset == t.data_offset, t.name
        assert ours.nbytes == t.n_bytes
        assert np.array_equal(ours.raw, t.data.reshape(-1).view(np.uint8)), t.name


_GGUF_PY_READERS: dict = {}


def _gguf_py(path):
    if path not in _GGUF_PY_READERS:  # gguf-py takes seconds to parse the tokenizer arrays
        _GGUF_PY_READERS[path] = gguf_py_reader(path)
    return _GGUF_PY_READERS[path]


@pytest.mark.real
def test_smollm2_matches_gguf_py(smollm2_gguf):
    f = GGUFFile(smollm2_gguf)
    _same_as_gguf_py(f, _gguf_py(smollm2_gguf))
    assert f.architecture == "llama" and len(f.metadata["tokenizer.ggml.merges"]) == 48900


@pytest.mark.real
def test_gemma3_matches_gguf_py(gemma3_gguf):
    f = GGUFFile(gemma3_gguf)
    _same_as_gguf_py(f, _gguf_py(gemma3_gguf))
    assert f.architecture == "gemma3" and f.metadata["tokenizer.ggml.scores"].dtype == np.float32


# -- broken files: one clear SterError each --------------------------------------------------

def test_bad_magic(tmp_path):
    data, _ = small_valid_file()
    refused(tmp_path, b"GGUX" + data[4:], "magic")
    refused(tmp_path, b"GG", "magic")


def test_empty_missing_and_directory(tmp_path):
    refused(tmp_path, b"", "empty")
    with pytest.raises(SterError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(SterError, match="not a regular file"):
        GGUFFile(tmp_path)
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(SterError, match="not a regular file"):  # and does not block
        GGUFFile(fifo)


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_unsupported_version(tmp_path, version):
    refused(tmp_path, Craft(version=version).build(), f"version {version}", "2 and 3")


def test_big_endian_file(tmp_path):
    data = Craft().build()
    refused(tmp_path, data[:4] + struct.pack(">I", 3) + data[8:], "big-endian")


def test_counts_that_cannot_fit(tmp_path):
    refused(tmp_path, Craft(n_kv=2**62).build(), "metadata entries", "cannot fit")
    refused(tmp_path, Craft(n_tensors=10**6).build(), "1000000 tensors", "cannot fit")


def test_string_length_past_end_of_file(tmp_path):
    c = Craft().add_kv("general.name", STRING, raw=gstring("abc", length=10**9))
    refused(tmp_path, c.build(), "'general.name'", "1000000000 bytes", "file ends")
    c = Craft()
    c.kvs.append(gstring("abc", length=2**63))  # the key itself
    refused(tmp_path, c.build(), "metadata key 0", "limit")


def test_array_length_past_end_of_file(tmp_path):
    c = Craft().add_kv("test.arr", ARRAY, raw=struct.pack("<IQ", U32, 2**40) + bytes(16))
    refused(tmp_path, c.build(), "'test.arr'", "1099511627776 elements", "cannot fit")
    # A count that fits, but one of the strings claims more bytes than the file has.
    body = struct.pack("<IQ", STRING, 3) + gstring("a") + gstring("b", length=500) + bytes(40)
    c = Craft().add_kv("tokenizer.ggml.tokens", ARRAY, raw=body)
    refused(tmp_path, c.build(), "'tokenizer.ggml.tokens'", "string 1 of 3", "500 bytes")


@pytest.mark.parametrize("key, vtype, value, elem, expected", [
    ("tokenizer.ggml.scores", ARRAY, [1, 2], U8, "array of float32"),
    ("tokenizer.ggml.tokens", ARRAY, [1, 2], I32, "array of string"),
    ("tokenizer.ggml.token_type", ARRAY, [1.0], F32, "array of int32"),
    ("tokenizer.ggml.merges", STRING, "a b", None, "array of string"),
    ("general.architecture", U32, 5, None, "string"),
    ("llama.block_count", F32, 30.0, None, "uint32"),
    ("llama.block_count", I32, 30, None, "uint32"),
    ("gemma3.rope.freq_base", STRING, "1e6", None, "float32 or float64"),
    ("tokenizer.ggml.eos_token_id", BOOL, True, None, "uint32"),
])
def test_known_key_with_wrong_type(tmp_path, key, vtype, value, elem, expected):
    c = Craft().add_kv(key, vtype, value, elem=elem)
    refused(tmp_path, c.build(), repr(key), "expected", expected)


@pytest.mark.parametrize("vtype, value, what", [
    (U64, 32, "has type uint64, expected uint32"),
    (STRING, "32", "has type string"),
    (U32, 0, "non-zero power of two"),
    (U32, 48, "non-zero power of two"),
])
def test_bad_alignment(tmp_path, vtype, value, what):
    c = Craft().add_kv("general.alignment", vtype, value)
    refused(tmp_path, c.build(), "general.alignment", what)


def test_dims_product_overflows(tmp_path):
    c = Craft().add_tensor("huge", b"", (2**32, 2**32, 2), 0)
    refused(tmp_path, c.build(), "'huge'", "overflows 64 bits")
    c = Craft().add_tensor("huge1", b"", (2**64 - 32,), Q8_0)
    refused(tmp_path, c.build(), "'huge1'", "overflows 64 bits")


def test_too_many_or_zero_dims(tmp_path):
    refused(tmp_path, Craft().add_tensor("t5", b"", (1, 1, 1, 1, 1), 0).build(), "'t5'", "5 dimensions")
    refused(tmp_path, Craft().add_tensor("t0", b"", (), 0).build(), "'t0'", "0 dimensions")


def test_data_offset_past_end_or_misaligned(tmp_path):
    refused(tmp_path, one_q8_tensor(Craft()).add_info("far", (32, 2), Q8_0, 2**40).build(), "'far'",
            "extends past the end")
    refused(tmp_path, Craft().add_info("last", (32, 2), Q8_0, 2**64 - 32).build(), "'last'", "extends past the end")
    refused(tmp_path, one_q8_tensor(Craft(), "odd", offset=4).build(), "'odd'", "offset 4", "alignment 32")
    c = one_q8_tensor(Craft().add_kv("general.alignment", U32, 64), "odd64", offset=32)
    refused(tmp_path, c.build(), "'odd64'", "alignment 64")


def test_tensor_data_past_end_of_file(tmp_path):
    data = one_q8_tensor(Craft(), "cut", rows=4).build()
    refused(tmp_path, data[:-1], "'cut'", "extends past the end")


def test_duplicate_names(tmp_path):
    c = Craft().add_kv("a.b", U32, 1).add_kv("a.b", U32, 2)
    refused(tmp_path, c.build(), "'a.b' appears twice")
    c = one_q8_tensor(one_q8_tensor(Craft(), "w"), "w")
    refused(tmp_path, c.build(), "tensor 'w' appears twice")


def _llama_cpp_opens(path: str) -> bool:
    """llama.cpp's own GGUF reader (gguf_init_from_file, without allocating tensor data) opens the file."""
    import ctypes

    lib = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here").llama_cpp._lib

    class Params(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]

    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, Params]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    ctx = lib.gguf_init_from_file(path.encode(), Params(True, None))
    if ctx:
        lib.gguf_free(ctx)
    return bool(ctx)


@pytest.mark.parametrize("layout, fragments", [
    ("packed", None),
    ("empty last", None),
    ("share", ("'a'", "'b'", "share bytes")),
    ("inside", ("'a'", "'b'", "share bytes")),   # 'a' is 136 bytes: 'b' starts inside it
    ("gap", ("'b'", "offset 128", "not at 96", "'a'")),
    ("reversed", ("'a'", "offset 96", "not at 0")),
    ("first not at 0", ("'a'", "offset 32", "not at 0")),
    ("empty at 0", ("'e'", "offset 0", "not at 96")),
])
def test_tensor_layout_is_read_as_llama_cpp_reads_it(tmp_path, layout, fragments):
    # Tensors one after another in the listed order, each padded to the alignment, is the only
    # layout llama.cpp opens: overlaps (a tensor silently running another's weights), gaps and
    # reorderings are refused by both.
    c = {"packed": lambda: one_q8_tensor(one_q8_tensor(Craft(), "a"), "b"),
         "empty last": lambda: one_q8_tensor(Craft(), "a").add_tensor("e", b"", (32, 0), Q8_0),
         "share": lambda: one_q8_tensor(one_q8_tensor(Craft(), "a"), "b", offset=0),
         "inside": lambda: one_q8_tensor(one_q8_tensor(Craft(), "a", rows=4), "b", offset=64),
         "gap": lambda: one_q8_tensor(one_q8_tensor(Craft(), "a"), "b", offset=128),
         "reversed": lambda: one_q8_tensor(one_q8_tensor(Craft(), "a", offset=96), "b", offset=0),
         "first not at 0": lambda: one_q8_tensor(Craft(), "a", offset=32),
         "empty at 0": lambda: one_q8_tensor(Craft(), "a").add_tensor("e", b"", (32, 0), Q8_0, offset=0)}[layout]()
    path = write(tmp_path, c.build())
    assert _llama_cpp_opens(path) == (fragments is None)
    if fragments is None:
        GGUFFile(path)
    else:
        refused(tmp_path, c.build(), *fragments)


def test_row_not_whole_blocks(tmp_path):
    c = Craft().add_tensor("blk.0.ffn_down.weight", bytes(144 * 2), (100, 2), Q4_K)
    refused(tmp_path, c.build(), "'blk.0.ffn_down.weight'", "100 weights", "Q4_K", "256")


def test_unknown_type_id(tmp_path):
    c = Craft().add_tensor("blk.3.attn_q.weight", bytes(64), (16,), 99)
    refused(tmp_path, c.build(), "'blk.3.attn_q.weight'", "type id 99")


@pytest.mark.parametrize("type_id, type_name", [(IQ2_XXS, "IQ2_XXS"), (TQ1_0, "TQ1_0"), (24, "I8")])
def test_unsupported_type_refused_at_open(tmp_path, type_id, type_name):
    t = quants.GGML_TYPES[type_id]
    c = Craft().add_tensor("blk.0.ffn_up.weight", bytes(t.type_size * 2), (2 * t.block_size,), type_id)
    c.add_tensor("blk.1.ffn_up.weight", bytes(t.type_size * 2), (2 * t.block_size,), type_id)
    path = write(tmp_path, c.build())
    with pytest.raises(SterError, match=f"'blk.0.ffn_up.weight' has type {type_name}.*1 more"):
        GGUFFile(path)
    f = GGUFFile(path, allow_unsupported=True)  # inspection still works
    assert f.tensor("blk.0.ffn_up.weight").type_name == type_name
    with pytest.raises(SterError, match=type_name):
        f.tensor("blk.0.ffn_up.weight").dequantize()


def test_truncated_anywhere(tmp_path):
    data, _ = small_valid_file()
    path = tmp_path / "cut.gguf"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(SterError):
            GGUFFile(path)


def test_other_malformed_values(tmp_path):
    refused(tmp_path, Craft().add_kv("x.y", 13, raw=b"").build(), "'x.y'", "value type 13")
    refused(tmp_path, Craft().add_kv("x.y", ARRAY, raw=struct.pack("<IQ", 77, 1)).build(), "element type 77")
    bad_utf8 = Craft()
    bad_utf8.kvs.append(gstring(b"k\xff") + struct.pack("<I", U8) + b"\x01")
    refused(tmp_path, bad_utf8.build(), "UTF-8")
    deep = struct.pack("<IQ", ARRAY, 1) * 20 + struct.pack("<IQ", U8, 0)
    refused(tmp_path, Craft().add_kv("x.deep", ARRAY, raw=deep).build(), "nests arrays")
    c = Craft().add_kv("tokenizer.ggml.tokens", ARRAY, ["a", "b"], elem=STRING)
    c.add_kv("tokenizer.ggml.scores", ARRAY, [0.0], elem=F32)
    refused(tmp_path, c.build(), "tokenizer.ggml.scores has 1 entries", "has 2")
    with pytest.raises(SterError, match="no tensor named 'missing'"):
        GGUFFile(write(tmp_path, small_valid_file()[0])).tensor("missing")


def test_scalar_value_types_cover_all_thirteen(tmp_path):
    # The crafted file's metadata uses every type; our reader reports them by name.
    f = GGUFFile(write(tmp_path, small_valid_file()[0]))
    names = {f.metadata_types[k].split(" ")[0] for k in f.metadata}
    assert names == {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string",
                     "array", "uint64", "int64", "float64"}
    assert {U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64} == set(range(13))


# -- bounded fuzzing: only SterError may escape ----------------------------------------------

@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fuzz") / "fuzz.gguf")


def _open_mutated(path: str, base: bytes, edits, cut) -> None:
    data = bytearray(base)
    for pos, value in edits:
        data[pos % len(data)] = value
    data = bytes(data[:cut]) if cut is not None else bytes(data)
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        f = GGUFFile(path)
    except SterError:
        return
    for name in f.tensor_names():  # whatever opened must also decode
        f.tensor(name).dequantize()


_edits = st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 255)), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=_edits, cut=st.one_of(st.none(), st.integers(0, 2000)))
def test_fuzz_small_file(fuzz_path, edits, cut):
    _open_mutated(fuzz_path, small_valid_file()[0], edits, cut)


_HEADERS: dict = {}


def _real_header(path) -> bytes:
    """The first bytes of a real file: its header (the tokenizer arrays included), no data."""
    if path not in _HEADERS:
        with open(path, "rb") as fh:
            _HEADERS[path] = fh.read(GGUFFile(path).data_offset)
    return _HEADERS[path]


@pytest.mark.real
def test_fuzz_real_header(smollm2_gguf, fuzz_path):
    header = _real_header(smollm2_gguf)
    # Mutations aimed at the structure: the first 4 KiB (counts, first keys), the start of the
    # token array, and the tensor infos at the end of the header.
    tokens_at = header.find(b"tokenizer.ggml.tokens")
    regions = st.sampled_from([(0, 4096), (tokens_at, tokens_at + 256), (len(header) - 16384, len(header))])

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(region=regions, offsets=st.lists(st.integers(0, 16383), min_size=1, max_size=4),
           values=st.lists(st.integers(0, 255), min_size=4, max_size=4), truncate=st.booleans())
    def run(region, offsets, values, truncate):
        lo, hi = region
        edits = [(lo + o % (hi - lo), v) for o, v in zip(offsets, values)]
        cut = (lo + offsets[0] % (hi - lo)) if truncate else None
        _open_mutated(fuzz_path, header, edits, cut)

    run()


def test_string_arrays_read_by_the_kernel_equal_the_python_loop(tmp_path, monkeypatch):
    from ster_py.gguf import reader

    assert reader._kernel_strings is not None  # the built kernels read string arrays
    texts = ["", "a", "é", "日本語", "\U0001F600", "<0x0A>", "x" * 300, "\x00"]
    body = struct.pack("<IQ", STRING, len(texts)) + b"".join(gstring(t) for t in texts)
    path = write(tmp_path, Craft().add_kv("tokenizer.ggml.tokens", ARRAY, raw=body).build())
    fast = GGUFFile(path).metadata["tokenizer.ggml.tokens"]
    monkeypatch.setattr(reader, "_kernel_strings", None)
    assert GGUFFile(path).metadata["tokenizer.ggml.tokens"] == fast == texts
    # A bad string in the middle: the same worded error from either path.
    monkeypatch.undo()
    body = struct.pack("<IQ", STRING, 3) + gstring("a") + gstring(b"\xff\xfe") + gstring("c")
    refused(tmp_path, Craft().add_kv("tokenizer.ggml.tokens", ARRAY, raw=body).build(),
            "'tokenizer.ggml.tokens'", "string 1", "UTF-8")
