# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Dequantization kernels for GGML block types (built as ster_py._kernels.quants).

One decoder per type turns ``n`` consecutive blocks into float32 weights; the
driver splits a tensor into chunks of blocks and runs them with OpenMP
``prange`` (no GIL). The float arithmetic mirrors gguf-py's ``gguf/quants.py``
(float32, same operation order; setup.py compiles with -ffp-contract=off so no
fused multiply-add changes a rounding), which makes the output bit-exact.
Block layouts: llama.cpp ggml-common.h; see ster_py/gguf/quants.py for the
numpy reference each decoder is tested against.
"""
from cython.parallel cimport prange
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

ctypedef void (*decode_fn)(const uint8_t* src, float* dst, Py_ssize_t n_blocks) noexcept nogil

cdef float[16] IQ4NL_VALUES
cdef float[16] MXFP4_VALUES
_iq4 = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_mx = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
for _i in range(16):
    IQ4NL_VALUES[_i] = _iq4[_i]
    MXFP4_VALUES[_i] = _mx[_i]


cdef inline float bits_to_f32(uint32_t bits) noexcept nogil:
    cdef float f
    memcpy(&f, &bits, 4)
    return f


cdef float half_bits_to_f32(uint32_t h) noexcept nogil:
    """IEEE half bits -> float, exactly (subnormals, inf, NaN payload kept)."""
    cdef uint32_t sign = (h & 0x8000) << 16
    cdef uint32_t exp = (h >> 10) & 0x1F
    cdef uint32_t man = h & 0x3FF
    cdef float f
    if exp == 0:
        # zero or subnormal: man * 2**-24 is exact in float32
        f = <float>man * <float>5.9604644775390625e-08
        return -f if sign else f
    if exp == 31:
        return bits_to_f32(sign | 0x7F800000 | (man << 13))
    return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13))


# All 65536 halves, decoded once (256 KiB): a load instead of a branchy conversion. Filled by a C loop
# (a loop over Python ints at module level took ~2 ms of every import).
cdef float F16_TABLE[65536]


cdef void _fill_f16_table() noexcept nogil:
    cdef uint32_t h
    for h in range(65536):
        F16_TABLE[h] = half_bits_to_f32(h)


_fill_f16_table()


cdef inline float f16_to_f32(const uint8_t* p) noexcept nogil:
    """Little-endian half at p -> float."""
    return F16_TABLE[<uint32_t>p[0] | (<uint32_t>p[1] << 8)]


cdef inline float e8m0_half(uint8_t e) noexcept nogil:
    """E8M0 scale byte -> 2**(e-127) / 2 as float32 (e < 2 lands in the subnormals)."""
    if e < 2:
        return bits_to_f32((<uint32_t>0x00200000) << e)
    return bits_to_f32((<uint32_t>(e - 1)) << 23)


# --- plain floats ------------------------------------------------------------

cdef void dec_f32(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    memcpy(dst, src, n * 4)


cdef void dec_f16(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = f16_to_f32(src + 2 * i)


cdef void dec_bf16(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = bits_to_f32((<uint32_t>src[2 * i] << 16) | (<uint32_t>src[2 * i + 1] << 24))


# --- legacy 32-weight blocks: byte l holds weight l (low nibble) and l + 16 (high) ---

cdef void dec_q4_0(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b
    cdef int l
    cdef float d
    cdef const uint8_t* x
    cdef float* y
    for b in range(n):
        x = src + 18 * b
        y = dst + 32 * b
        d = f16_to_f32(x)
        for l in range(16):
            y[l] = d * <float>(<int>(x[2 + l] & 0x0F) - 8)
            y[l + 16] = d * <float>(<int>(x[2 + l] >> 4) - 8)


cdef void dec_q4_1(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b
    cdef int l
    cdef float d, m
    cdef const uint8_t* x
    cdef float* y
    for b in range(n):
        x = src + 20 * b
        y = dst + 32 * b
        d = f16_to_f32(x)
        m = f16_to_f32(x + 2)
        for l in range(16):
            y[l] = d * <float>(x[4 + l] & 0x0F) + m
            y[l + 16] = d * <float>(x[4 + l] >> 4) + m


cdef inline uint32_t le32(const uint8_t* p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef void dec_q5_0(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b
    cdef int l
    cdef float d
    cdef uint32_t qh
    cdef const uint8_t* x
    cdef float* y
    for b in range(n):
        x = src + 22 * b
        y = dst + 32 * b
        d = f16_to_f32(x)
        qh = le32(x + 2)
        for l in range(16):
            y[l] = d * <float>(<int>((x[6 + l] & 0x0F) | (((qh >> l) & 1) << 4)) - 16)
            y[l + 16] = d * <float>(<int>((x[6 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16)


cdef void dec_q5_1(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b
    cdef int l
    cdef float d, m
    cdef uint32_t qh
    cdef const uint8_t* x
    cdef float* y
    for b in range(n):
        x = src + 24 * b
        y = dst + 32 * b
        d = f16_to_f32(x)
        m = f16_to_f32(x + 2)
        qh = le32(x + 4)
        for l in range(16):
            y[l] = d * <float>((x[8 + l] & 0x0F) | (((qh >> l) & 1) << 4)) + m
            y[l + 16] = d * <float>((x[8 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) + m


cdef void dec_q8_0(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b
    cdef int l
    cdef float d
    cdef const uint8_t* x
    cdef float* y
    for b in range(n):
        x = src + 34 * b
        y = dst + 32 * b
        d = f16_to_f32(x)
        for l in range(32):
            y[l] = d * <float>(<int8_t>x[2 + l])


cdef void dec_iq4_nl(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b
    cdef int l
    cdef float d
    cdef const uint8_t* x
    cdef float* y
    for b in range(n):
        x = src + 18 * b
        y = dst + 32 * b
        d = f16_to_f32(x)
        for l in range(16):
            y[l] = d * IQ4NL_VALUES[x[2 + l] & 0x0F]
            y[l + 16] = d * IQ4NL_VALUES[x[2 + l] >> 4]


cdef void dec_mxfp4(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b
    cdef int l
    cdef float d
    cdef const uint8_t* x
    cdef float* y
    for b in range(n):
        x = src + 17 * b
        y = dst + 32 * b
        d = e8m0_half(x[0])
        for l in range(16):
            y[l] = d * MXFP4_VALUES[x[1 + l] & 0x0F]
            y[l + 16] = d * MXFP4_VALUES[x[1 + l] >> 4]


# --- K-quants: 256-weight super-blocks. Weight w = 128h + 32j + l where it helps. ---

cdef void dec_q2_k(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    # scales[16] | qs[64] | d | dmin; sub-block of 16: scale nibble (x d), min nibble (x dmin)
    cdef Py_ssize_t b
    cdef int h, j, part, l, s
    cdef float d, dmin, dl, ml
    cdef const uint8_t* x
    cdef const uint8_t* q
    cdef float* y
    for b in range(n):
        x = src + 84 * b
        y = dst + 256 * b
        d = f16_to_f32(x + 80)
        dmin = f16_to_f32(x + 82)
        for h in range(2):
            q = x + 16 + 32 * h
            for j in range(4):
                for part in range(2):
                    s = x[8 * h + 2 * j + part]
                    dl = d * <float>(s & 0x0F)
                    ml = dmin * <float>(s >> 4)
                    for l in range(16 * part, 16 * part + 16):
                        y[128 * h + 32 * j + l] = dl * <float>((q[l] >> (2 * j)) & 3) - ml


cdef void dec_q3_k(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    # hmask[32] | qs[64] | scales[12] | d; 16 six-bit scales (bias 32), one per 16 weights
    cdef Py_ssize_t b
    cdef int h, j, part, l, i, sc, q
    cdef float d, dl
    cdef const uint8_t* x
    cdef const uint8_t* s
    cdef float* y
    for b in range(n):
        x = src + 110 * b
        y = dst + 256 * b
        s = x + 96
        d = f16_to_f32(x + 108)
        for h in range(2):
            for j in range(4):
                for part in range(2):
                    i = 8 * h + 2 * j + part
                    sc = ((s[i & 7] >> (4 * (i >> 3))) & 0x0F) | (((s[8 + (i & 3)] >> (2 * (i >> 2))) & 3) << 4)
                    dl = d * <float>(sc - 32)
                    for l in range(16 * part, 16 * part + 16):
                        q = (x[32 + 32 * h + l] >> (2 * j)) & 3
                        if not ((x[l] >> (4 * h + j)) & 1):
                            q -= 4
                        y[128 * h + 32 * j + l] = dl * <float>q


cdef inline void scale_min_k4(const uint8_t* s, int j, int* sc, int* m) noexcept nogil:
    """Q4_K/Q5_K: six-bit scale and min of sub-block j (0..7) from the 12 packed bytes."""
    if j < 4:
        sc[0] = s[j] & 63
        m[0] = s[j + 4] & 63
    else:
        sc[0] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4)
        m[0] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


cdef void dec_q4_k(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    # d | dmin | scales[12] | qs[128]; weight 64c + 32s + l = nibble s of qs[32c + l]
    cdef Py_ssize_t b
    cdef int c, s, l, sc, m
    cdef float d, dmin, dl, ml
    cdef const uint8_t* x
    cdef const uint8_t* q
    cdef float* y
    for b in range(n):
        x = src + 144 * b
        y = dst + 256 * b
        d = f16_to_f32(x)
        dmin = f16_to_f32(x + 2)
        for c in range(4):
            q = x + 16 + 32 * c
            for s in range(2):
                scale_min_k4(x + 4, 2 * c + s, &sc, &m)
                dl = d * <float>sc
                ml = dmin * <float>m
                for l in range(32):
                    y[64 * c + 32 * s + l] = dl * <float>((q[l] >> (4 * s)) & 0x0F) - ml


cdef void dec_q5_k(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    # d | dmin | scales[12] | qh[32] | qs[128]; 5th bit of weight w is bit w//32 of qh[w%32]
    cdef Py_ssize_t b
    cdef int c, s, l, sc, m, sub
    cdef float d, dmin, dl, ml
    cdef const uint8_t* x
    cdef const uint8_t* q
    cdef float* y
    for b in range(n):
        x = src + 176 * b
        y = dst + 256 * b
        d = f16_to_f32(x)
        dmin = f16_to_f32(x + 2)
        for c in range(4):
            q = x + 48 + 32 * c
            for s in range(2):
                sub = 2 * c + s
                scale_min_k4(x + 4, sub, &sc, &m)
                dl = d * <float>sc
                ml = dmin * <float>m
                for l in range(32):
                    y[32 * sub + l] = dl * <float>(((q[l] >> (4 * s)) & 0x0F) | (((x[16 + l] >> sub) & 1) << 4)) - ml


cdef void dec_q6_k(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    # ql[128] | qh[64] | scales[16] int8 | d; one scale per 16 weights, codes biased by 32.
    # Per half h (128 weights), lane l < 32: weights l, 32+l, 64+l, 96+l take the low nibble of
    # ql[l], ql[32+l], then the high nibble of ql[l], ql[32+l]; their top 2 bits are bit pairs
    # 0, 2, 4, 6 of qh[l].
    cdef Py_ssize_t b
    cdef int h, l, s
    cdef float d
    cdef float dl[16]
    cdef const uint8_t* x
    cdef const uint8_t* ql
    cdef const uint8_t* qh
    cdef const float* sc
    cdef float* y
    for b in range(n):
        x = src + 210 * b
        y = dst + 256 * b
        d = f16_to_f32(x + 208)
        for s in range(16):
            dl[s] = d * <float>(<int8_t>x[192 + s])
        for h in range(2):
            ql = x + 64 * h
            qh = x + 128 + 32 * h
            sc = dl + 8 * h
            for l in range(32):
                s = l >> 4
                y[128 * h + l] = sc[s] * <float>(<int>((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32)
                y[128 * h + 32 + l] = sc[s + 2] * <float>(<int>((ql[32 + l] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32)
                y[128 * h + 64 + l] = sc[s + 4] * <float>(<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32)
                y[128 * h + 96 + l] = sc[s + 6] * <float>(<int>((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32)


cdef void dec_iq4_xs(const uint8_t* src, float* dst, Py_ssize_t n) noexcept nogil:
    # d | scales_h u16 | scales_l[4] | qs[128]; 8 sub-blocks of 32 with 6-bit scales (bias 32)
    cdef Py_ssize_t b
    cdef int ib, l, ls
    cdef uint32_t sh
    cdef float d, dl
    cdef const uint8_t* x
    cdef const uint8_t* q
    cdef float* y
    for b in range(n):
        x = src + 136 * b
        y = dst + 256 * b
        d = f16_to_f32(x)
        sh = <uint32_t>x[2] | (<uint32_t>x[3] << 8)
        for ib in range(8):
            ls = ((x[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0x0F) | (((sh >> (2 * ib)) & 3) << 4)
            dl = d * <float>(ls - 32)
            q = x + 8 + 16 * ib
            for l in range(16):
                y[32 * ib + l] = dl * IQ4NL_VALUES[q[l] & 0x0F]
                y[32 * ib + 16 + l] = dl * IQ4NL_VALUES[q[l] >> 4]


# --- driver ------------------------------------------------------------------

cdef decode_fn _lookup(int type_id, int* block_size, int* type_size):
    # (block_size, type_size) must agree with ster_py.gguf.quants.GGML_TYPES
    if type_id == 0:
        block_size[0] = 1; type_size[0] = 4; return dec_f32
    if type_id == 1:
        block_size[0] = 1; type_size[0] = 2; return dec_f16
    if type_id == 30:
        block_size[0] = 1; type_size[0] = 2; return dec_bf16
    if type_id == 2:
        block_size[0] = 32; type_size[0] = 18; return dec_q4_0
    if type_id == 3:
        block_size[0] = 32; type_size[0] = 20; return dec_q4_1
    if type_id == 6:
        block_size[0] = 32; type_size[0] = 22; return dec_q5_0
    if type_id == 7:
        block_size[0] = 32; type_size[0] = 24; return dec_q5_1
    if type_id == 8:
        block_size[0] = 32; type_size[0] = 34; return dec_q8_0
    if type_id == 10:
        block_size[0] = 256; type_size[0] = 84; return dec_q2_k
    if type_id == 11:
        block_size[0] = 256; type_size[0] = 110; return dec_q3_k
    if type_id == 12:
        block_size[0] = 256; type_size[0] = 144; return dec_q4_k
    if type_id == 13:
        block_size[0] = 256; type_size[0] = 176; return dec_q5_k
    if type_id == 14:
        block_size[0] = 256; type_size[0] = 210; return dec_q6_k
    if type_id == 20:
        block_size[0] = 32; type_size[0] = 18; return dec_iq4_nl
    if type_id == 23:
        block_size[0] = 256; type_size[0] = 136; return dec_iq4_xs
    if type_id == 39:
        block_size[0] = 32; type_size[0] = 17; return dec_mxfp4
    return NULL


def supported_type_ids():
    """GGML type ids this module decodes."""
    cdef int bs, ts
    return tuple(t for t in range(64) if _lookup(t, &bs, &ts) != NULL)


def block_geometry(int type_id):
    """(block_size, type_size) the kernel uses for a type id; ValueError if it has no decoder."""
    cdef int bs, ts
    if _lookup(type_id, &bs, &ts) == NULL:
        raise ValueError(f"no decoder for GGML type id {type_id}")
    return bs, ts


def dequantize_into(const uint8_t[::1] src, float[::1] dst, int type_id, int n_threads=0):
    """Decode ``src`` (whole blocks of ``type_id``) into ``dst`` (float32, one per weight).

    src: uint8 [n_blocks * type_size]; dst: float32 [n_blocks * block_size], written in place.
    n_threads: OpenMP threads; 0 = the OpenMP default. Raises ValueError on a size mismatch or
    a type without a decoder (the Python layer turns those into SterError before calling).
    """
    cdef int bs, ts
    cdef decode_fn fn = _lookup(type_id, &bs, &ts)
    if fn == NULL:
        raise ValueError(f"no decoder for GGML type id {type_id}")
    cdef Py_ssize_t n_out = dst.shape[0]
    if n_out % bs:
        raise ValueError(f"output length {n_out} is not a whole number of {bs}-weight blocks")
    cdef Py_ssize_t nb = n_out // bs
    if src.shape[0] != nb * ts:
        raise ValueError(f"{nb} blocks need {nb * ts} bytes, got {src.shape[0]}")
    if nb == 0:
        return
    # Chunks of about 16k weights, handed out dynamically: big enough to amortise scheduling,
    # small enough that a busy core does not hold the others up.
    cdef Py_ssize_t chunk = max(1, 16384 // bs)
    cdef Py_ssize_t n_chunks = (nb + chunk - 1) // chunk
    cdef const uint8_t* sp = &src[0]
    cdef float* dp = &dst[0]
    cdef Py_ssize_t c, start, cnt
    with nogil:
        if n_chunks == 1 or n_threads == 1:
            fn(sp, dp, nb)
        elif n_threads <= 0:
            for c in prange(n_chunks, schedule="dynamic"):
                start = c * chunk
                cnt = min(chunk, nb - start)
                fn(sp + start * ts, dp + start * bs, cnt)
        else:
            for c in prange(n_chunks, schedule="dynamic", num_threads=n_threads):
                start = c * chunk
                cnt = min(chunk, nb - start)
                fn(sp + start * ts, dp + start * bs, cnt)


from cpython.unicode cimport PyUnicode_DecodeUTF8


def gguf_strings(const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t count):
    """Read ``count`` GGUF strings (u64 little-endian byte length, then UTF-8 bytes) from
    ``buf`` at byte offset ``pos``: the vocabulary arrays of a GGUF header (262,144 strings
    for Gemma 3), which a Python loop reads ~10x slower.

    Returns (strings, end offset), or (None, index of the first bad string) when a length
    runs past the buffer, a string runs past it, or a string is not UTF-8; the caller then
    re-reads with its own checks to word the error. The list grows item by item, so its
    memory follows the bytes actually parsed, never the claimed count.
    """
    cdef Py_ssize_t size = buf.shape[0], i
    cdef unsigned long long n
    cdef list out = []
    for i in range(count):
        if pos < 0 or pos + 8 > size:
            return None, i
        n = 0
        memcpy(&n, &buf[pos], 8)   # GGUF is little-endian, as every machine ster builds for
        pos += 8
        if n > <unsigned long long>(size - pos):
            return None, i
        try:
            out.append(PyUnicode_DecodeUTF8(<const char*>&buf[pos] if n else <const char*>&buf[0], <Py_ssize_t>n, "strict"))
        except UnicodeDecodeError:
            return None, i
        pos += <Py_ssize_t>n
    return out, pos


cdef extern from "Python.h":
    Py_ssize_t PyUnicode_FindChar(object s, Py_UCS4 ch, Py_ssize_t start, Py_ssize_t end, int direction) except -2
    object PyUnicode_Substring(object s, Py_ssize_t start, Py_ssize_t end)


def merge_pairs(list lines):
    """``tokenizer.ggml.merges`` lines (str) -> [(left, right)]: each line cut at its first space
    after the first character (llama.cpp's llama_vocab load), so a pair may start with a space; a line
    without such a space gives (line, ""). The load-time path of 50k-500k lines, which a Python loop
    (or ``str.partition`` mapped in C and a fix-up pass) runs 2-3x slower. ster_py/gguf/tokenizer.py's
    ``_split_merges`` is the reference; TypeError for an item that is not a str (a subclass is one)."""
    cdef list out = []
    cdef Py_ssize_t n, cut
    cdef object line
    for line in lines:
        if not isinstance(line, str):
            raise TypeError("merge lines must be str")
        n = len(<str>line)
        cut = PyUnicode_FindChar(line, 32, 1, n, 1) if n > 1 else -1
        if cut > 0:
            out.append((PyUnicode_Substring(line, 0, cut), PyUnicode_Substring(line, cut + 1, n)))
        else:
            out.append((line, ""))
    return out
