"""Conversion kernels for reduced-precision transfer: float32/64 <-> fp16/bf16.

numpy 1.23 converts to and from float16 one element at a time (~4 ns per
value here), which would cost more than the transfer it saves.  These few
loops, compiled on first use with the system C compiler (the one Theano
already needs) and loaded with :mod:`ctypes`, run at memory speed: F16C
instructions where the CPU has them, plain C elsewhere.  Without a compiler
(or with ``TMPI_NO_KERNELS=1``) the same operations run in numpy, slower but
with identical results.

:func:`encode`, :func:`decode`, :func:`accumulate` and :func:`reduce_codes`
take contiguous 1-d numpy arrays and write into ``out``; none allocates.
``fmt`` is ``"fp16"`` or ``"bf16"``; encoded values are stored as ``uint16``
bit patterns.  Rounding is to nearest even in both formats.

:func:`encode_words`, :func:`decode_words`, :func:`bf16_encode` and
:func:`bf16_decode` are the same conversions written once for any array
module ``xp`` (numpy or CuPy): the numpy fallback above, and the GPU
exchangers' conversions on the device.
"""
import ctypes
import os
import subprocess

import numpy as np

from tmpi_adapters import native

NO_KERNELS_ENV = "TMPI_NO_KERNELS"

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TMPI_X86 1
#endif

typedef int64_t idx_t;

/* ---- portable scalar conversions (round to nearest even) ---- */
static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t to_bf16(float f) {
    /* Branch-free so the loops vectorize; NaN becomes a quiet NaN. */
    uint32_t u = f2u(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? quiet : rounded);
}
static inline float from_bf16(uint16_t h) { return u2f((uint32_t)h << 16); }

static uint16_t to_fp16_scalar(float f) {
    uint32_t u = f2u(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* overflow: inf */
    if (a < 0x38800000u) {                                            /* subnormal or 0 */
        if (a < 0x33000000u) return (uint16_t)sign;                   /* rounds to 0 */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;           /* 14 + (127 - 15 - e) + 1 - 1 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  /* rebias 127 -> 15 */
    return (uint16_t)(sign | (r >> 13));
}
static float from_fp16_scalar(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-08f;   /* m * 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- fp16 loops: F16C when the CPU has it ---- */
#ifdef TMPI_X86
__attribute__((target("avx,f16c")))
static void enc16_f16c(const float *s, idx_t n, float k, uint16_t *d) {
    idx_t i = 0; __m256 vk = _mm256_set1_ps(k);
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
            _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + i), vk), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = to_fp16_scalar(s[i] * k);
}
__attribute__((target("avx,f16c")))
static void dec16_f16c(const uint16_t *s, idx_t n, float *d) {
    idx_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = from_fp16_scalar(s[i]);
}
__attribute__((target("avx,f16c")))
static void acc16_f16c(const uint16_t *s, idx_t n, float *d) {
    idx_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i),
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)))));
    for (; i < n; i++) d[i] += from_fp16_scalar(s[i]);
}
#define BF16_LOOPS(suffix) \
static void encbf_##suffix(const float *s, idx_t n, float k, uint16_t *d) \
    { for (idx_t i = 0; i < n; i++) d[i] = to_bf16(s[i] * k); } \
static void decbf_##suffix(const uint16_t *s, idx_t n, float *d) \
    { for (idx_t i = 0; i < n; i++) d[i] = from_bf16(s[i]); } \
static void accbf_##suffix(const uint16_t *s, idx_t n, float *d) \
    { for (idx_t i = 0; i < n; i++) d[i] += from_bf16(s[i]); }
__attribute__((target("avx2"))) BF16_LOOPS(avx2)
static int portable = 0;
static int has_f16c(void)
    { return !portable && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx"); }
static int has_avx2(void) { return !portable && __builtin_cpu_supports("avx2"); }
#else
static int portable = 0;
static int has_f16c(void) { return 0; }
static int has_avx2(void) { return 0; }
#endif
BF16_LOOPS(plain)

int tmpi_has_f16c(void) { return has_f16c(); }
/* Tests compare the portable loops with numpy on machines with F16C. */
void tmpi_set_portable(int on) { portable = on; }

void tmpi_encode_f32(const float *s, idx_t n, double k, uint16_t *d, int bf16) {
    float kf = (float)k;
#ifdef TMPI_X86
    if (bf16 && has_avx2()) { encbf_avx2(s, n, kf, d); return; }
#endif
    if (bf16) { encbf_plain(s, n, kf, d); return; }
#ifdef TMPI_X86
    if (has_f16c()) { enc16_f16c(s, n, kf, d); return; }
#endif
    for (idx_t i = 0; i < n; i++) d[i] = to_fp16_scalar(s[i] * kf);
}

void tmpi_encode_f64(const double *s, idx_t n, double k, uint16_t *d, int bf16) {
    float buf[1024];
    for (idx_t i = 0; i < n; i += 1024) {
        idx_t m = n - i < 1024 ? n - i : 1024;
        for (idx_t j = 0; j < m; j++) buf[j] = (float)(s[i + j] * k);
        tmpi_encode_f32(buf, m, 1.0, d + i, bf16);
    }
}

void tmpi_decode(const uint16_t *s, idx_t n, float *d, int bf16) {
#ifdef TMPI_X86
    if (bf16 && has_avx2()) { decbf_avx2(s, n, d); return; }
#endif
    if (bf16) { decbf_plain(s, n, d); return; }
#ifdef TMPI_X86
    if (has_f16c()) { dec16_f16c(s, n, d); return; }
#endif
    for (idx_t i = 0; i < n; i++) d[i] = from_fp16_scalar(s[i]);
}

void tmpi_accumulate(const uint16_t *s, idx_t n, float *d, int bf16) {
#ifdef TMPI_X86
    if (bf16 && has_avx2()) { accbf_avx2(s, n, d); return; }
#endif
    if (bf16) { accbf_plain(s, n, d); return; }
#ifdef TMPI_X86
    if (has_f16c()) { acc16_f16c(s, n, d); return; }
#endif
    for (idx_t i = 0; i < n; i++) d[i] += from_fp16_scalar(s[i]);
}

/* dst = encode(sum_j decode(srcs[j])) in one pass, summing in float32 in
   cache-sized blocks; dst may be srcs[0]. */
void tmpi_reduce_codes(const uint16_t *const *srcs, int k, idx_t n, uint16_t *dst, int bf16) {
    float acc[2048];
    for (idx_t i = 0; i < n; i += 2048) {
        idx_t m = n - i < 2048 ? n - i : 2048;
        tmpi_decode(srcs[0] + i, m, acc, bf16);
        for (int j = 1; j < k; j++) tmpi_accumulate(srcs[j] + i, m, acc, bf16);
        tmpi_encode_f32(acc, m, 1.0, dst + i, bf16);
    }
}
"""

_library = None
_loaded = False
#: Why the compiled kernels are not in use (``None`` when they are).
unavailable_reason = None


def _load():
    """The compiled library, or ``None`` (and :data:`unavailable_reason`)."""
    global _library, _loaded, unavailable_reason
    if _loaded:
        return _library
    _loaded = True
    if os.environ.get(NO_KERNELS_ENV, "").strip() not in ("", "0"):
        unavailable_reason = "%s is set" % NO_KERNELS_ENV
        return None
    try:
        library = ctypes.CDLL(native.build(_SOURCE, "kernels", flags=("-O3",)))
    except (OSError, subprocess.CalledProcessError) as exc:
        unavailable_reason = "no C compiler could build them (%s)" % (exc,)
        return None
    p, n, k, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
    for name, args in (("tmpi_encode_f32", (p, n, k, p, flag)),
                       ("tmpi_encode_f64", (p, n, k, p, flag)),
                       ("tmpi_decode", (p, n, p, flag)),
                       ("tmpi_accumulate", (p, n, p, flag)),
                       ("tmpi_reduce_codes", (ctypes.POINTER(p), flag, n, p, flag)),
                       ("tmpi_set_portable", (flag,))):
        getattr(library, name).argtypes = args
        getattr(library, name).restype = None
    _library = library
    return library


def backend():
    """``"c+f16c"``, ``"c"`` or ``"numpy"``: what performs the conversions here."""
    library = _load()
    if library is None:
        return "numpy"
    return "c+f16c" if library.tmpi_has_f16c() else "c"


def set_portable(on):
    """Use the plain C loops even where the CPU has F16C/AVX2 (for tests)."""
    library = _load()
    if library is not None:
        library.tmpi_set_portable(bool(on))


def _address(array):
    return array.__array_interface__["data"][0]


def _check(array, dtype=None):
    if not array.flags.c_contiguous:
        raise ValueError("kernels need C-contiguous arrays")
    if dtype is not None and array.dtype != dtype:
        raise ValueError("expected %s, got %s" % (dtype, array.dtype))


def _check_pair(what, src, src_dtype, out, out_dtype):
    """Both contiguous, of the dtypes given (``None``: any), of one size."""
    _check(src, src_dtype)
    _check(out, out_dtype)
    if src.size != out.size:
        raise ValueError("%s: %d values into %d slots" % (what, src.size, out.size))


# -- array-module versions: numpy (the fallback, and the reference in tests) or ----
# -- CuPy (the GPU exchangers: CuPy has no bfloat16 dtype, so the bits are computed) -

def _into(out, values, dtype):
    """``values`` as ``dtype``: written into ``out`` when given, else a new array
    (or ``values`` itself when it has that dtype already)."""
    if out is None:
        return values.astype(dtype, copy=False)
    out[...] = values
    return out


def _is_fp16(fmt):
    """True for ``"fp16"``, False for ``"bf16"``; ValueError for anything else."""
    if fmt not in ("fp16", "bf16"):
        raise ValueError("no 16-bit encoding for precision %r" % (fmt,))
    return fmt == "fp16"


def bf16_encode(values, out=None, xp=np):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even; NaN stays NaN.

    ``xp`` is the array module of ``values``: numpy or CuPy.
    """
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    sixteen = xp.uint32(16)
    rounded = (bits + xp.uint32(0x7FFF) + ((bits >> sixteen) & xp.uint32(1))) >> sixteen
    # Rounding could carry a NaN's mantissa into infinity: keep it a quiet NaN.
    nan = (bits & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return _into(out, xp.where(nan, (bits >> sixteen) | xp.uint32(0x40), rounded), xp.uint16)


def bf16_decode(bits, out=None, xp=np):
    """bfloat16 bits (uint16) -> float32; ``xp`` is numpy or CuPy."""
    wide = xp.asarray(bits, dtype=xp.uint16).astype(xp.uint32) << xp.uint32(16)
    return _into(out, wide.view(xp.float32), xp.float32)


def encode_words(values, fmt, out=None, xp=np):
    """float32 ``values`` -> the uint16 words of ``fmt`` (``"fp16"``/``"bf16"``),
    into ``out`` when given; ``xp`` is numpy or CuPy."""
    if not _is_fp16(fmt):
        return bf16_encode(values, out=out, xp=xp)
    halves = _into(None if out is None else out.view(xp.float16), values, xp.float16)
    return halves.view(xp.uint16) if out is None else out


def decode_words(words, fmt, out=None, xp=np):
    """The inverse of :func:`encode_words`: uint16 words of ``fmt`` -> float32."""
    if not _is_fp16(fmt):
        return bf16_decode(words, out=out, xp=xp)
    return _into(out, words.view(xp.float16), xp.float32)


def _numpy_encode(src, factor, out, fmt):
    # In the source's precision, then float32: what the C loops do.
    encode_words(np.multiply(src, factor).astype(np.float32, copy=False), fmt, out=out)


def _numpy_decode(src, out, fmt):
    decode_words(src, fmt, out=out)


# -- the public functions ---------------------------------------------------------

def encode(src, factor, out, fmt):
    """``out = fmt(src * factor)``; ``src`` float32 or float64, ``out`` uint16."""
    _check_pair("encode", src, None, out, np.uint16)
    library = _load()
    if library is None or src.dtype not in (np.float32, np.float64):
        return _numpy_encode(src, factor, out, fmt)
    fn = library.tmpi_encode_f32 if src.dtype == np.float32 else library.tmpi_encode_f64
    fn(_address(src), src.size, float(factor), _address(out), fmt == "bf16")


def decode(src, out, fmt):
    """``out = float32(src)`` for ``src`` holding ``fmt`` bits."""
    _check_pair("decode", src, np.uint16, out, np.float32)
    library = _load()
    if library is None:
        return _numpy_decode(src, out, fmt)
    library.tmpi_decode(_address(src), src.size, _address(out), fmt == "bf16")


def accumulate(src, out, fmt):
    """``out += float32(src)``: partial sums stay in float32."""
    _check_pair("accumulate", src, np.uint16, out, np.float32)
    library = _load()
    if library is None:
        out += decode_words(src, fmt)
        return
    library.tmpi_accumulate(_address(src), src.size, _address(out), fmt == "bf16")


def reduce_codes(parts, out, fmt):
    """``out = fmt(sum of float32(part) for part in parts))``: the sum is taken
    in float32 and rounded once; ``out`` may be ``parts[0]``."""
    for part in parts:
        _check(part, np.uint16)
        if part.size != out.size:
            raise ValueError("reduce_codes: parts of %d values into %d slots"
                             % (part.size, out.size))
    _check(out, np.uint16)
    library = _load()
    if library is None:
        acc = np.empty(out.size, dtype=np.float32)
        _numpy_decode(parts[0], acc, fmt)
        for part in parts[1:]:
            accumulate(part, acc, fmt)
        return _numpy_encode(acc, 1.0, out, fmt)
    pointers = (ctypes.c_void_p * len(parts))(*[_address(part) for part in parts])
    library.tmpi_reduce_codes(pointers, len(parts), out.size, _address(out), fmt == "bf16")
