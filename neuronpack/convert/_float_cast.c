/* neuronpack.convert._float_cast: the casts of float_cast.py (F32, F16, BF16 stored bytes) in C, so that converting
 * an EAGLE draft needs neither torch nor numpy (importing numpy alone took ~55 ms of a ~200 ms conversion).
 *
 * Bit for bit what torch's CPU Tensor.to gives for every value but NaN: every cast widens to float32 exactly, then
 * narrows rounding to nearest even (bfloat16 by c10::BFloat16's bias formula, float16 by the compiler's IEEE
 * conversion, subnormals included). Built when the package is installed (setup.py; optional: without a C compiler
 * float_cast.py casts with numpy). One pass per call, the GIL released; the loops are plain C that the compiler
 * vectorises, once per instruction set (target_clones where the compiler has it).
 *
 *     cast_into(src, source, dst, target) -> 0 | 1 | -1
 *
 * src: a bytes-like of ``source`` values ("F32" | "F16" | "BF16"), dst: a writable bytes-like of exactly as many
 * ``target`` values. 1: a finite value became inf; -1: a value is NaN (dst then holds garbage: the caller casts
 * those values with torch, whose NaN bits are its own business).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

enum code { F32, F16, BF16, UNKNOWN };

static enum code parse(const char *name) {
    if (strcmp(name, "F32") == 0) return F32;
    if (strcmp(name, "F16") == 0) return F16;
    if (strcmp(name, "BF16") == 0) return BF16;
    return UNKNOWN;
}

static const uint32_t F32_INF = 0x7F800000u;

static inline float as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t as_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline uint32_t f16_bits_to_f32_bits(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return as_bits((float)v); }
static inline uint16_t f32_bits_to_f16_bits(uint32_t u) {
    _Float16 v = (_Float16)as_float(u);
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}
/* c10::BFloat16's round_to_nearest_even, for non-NaN float32 bits */
static inline uint16_t f32_bits_to_bf16_bits(uint32_t u) { return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); }

/* Each loop casts n values and returns the largest magnitude of the float32 values it narrowed (or widened): NaN
 * shows as a magnitude above F32_INF, overflow as a finite top whose cast is inf. */
#define CAST_LOOP(NAME, SRC_T, DST_T, WIDEN, NARROW)                                                          \
    CLONES static uint32_t NAME(const SRC_T *restrict src, DST_T *restrict dst, Py_ssize_t n) {                \
        uint32_t top = 0;                                                                                      \
        for (Py_ssize_t i = 0; i < n; ++i) {                                                                   \
            const uint32_t u = WIDEN(src[i]);                                                                  \
            const uint32_t m = u & 0x7FFFFFFFu;                                                                \
            top = m > top ? m : top;                                                                           \
            dst[i] = NARROW(u);                                                                                \
        }                                                                                                      \
        return top;                                                                                            \
    }

#define SAME(u) (u)
#define BF16_WIDEN(h) ((uint32_t)(h) << 16)
#define BF16_BACK(u) ((uint16_t)((u) >> 16))
CAST_LOOP(f32_copy, uint32_t, uint32_t, SAME, SAME)
CAST_LOOP(bf16_copy, uint16_t, uint16_t, BF16_WIDEN, BF16_BACK)
CAST_LOOP(f16_copy, uint16_t, uint16_t, f16_bits_to_f32_bits, f32_bits_to_f16_bits) /* exact for non-NaN */
CAST_LOOP(f32_to_bf16, uint32_t, uint16_t, SAME, f32_bits_to_bf16_bits)
CAST_LOOP(f32_to_f16, uint32_t, uint16_t, SAME, f32_bits_to_f16_bits)
CAST_LOOP(bf16_to_f16, uint16_t, uint16_t, BF16_WIDEN, f32_bits_to_f16_bits)
CAST_LOOP(bf16_to_f32, uint16_t, uint32_t, BF16_WIDEN, SAME)
CAST_LOOP(f16_to_bf16, uint16_t, uint16_t, f16_bits_to_f32_bits, f32_bits_to_bf16_bits)
CAST_LOOP(f16_to_f32, uint16_t, uint32_t, f16_bits_to_f32_bits, SAME)

static int narrows_to_inf(enum code target, uint32_t top) {
    if (target == F32) return 0;
    if (target == BF16) return (f32_bits_to_bf16_bits(top) & 0x7FFFu) == 0x7F80u;
    return (f32_bits_to_f16_bits(top) & 0x7FFFu) == 0x7C00u;
}

static PyObject *cast_into(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, dst;
    const char *source_name, *target_name;
    if (!PyArg_ParseTuple(args, "y*sw*s", &src, &source_name, &dst, &target_name)) return NULL;
    PyObject *result = NULL;
    const enum code source = parse(source_name), target = parse(target_name);
    const Py_ssize_t in_size = source == F32 ? 4 : 2, out_size = target == F32 ? 4 : 2;
    if (source == UNKNOWN || target == UNKNOWN) {
        PyErr_Format(PyExc_ValueError, "cast %s -> %s: only F32, F16, BF16", source_name, target_name);
    } else if (src.len % in_size || dst.len != src.len / in_size * out_size) {
        PyErr_Format(PyExc_ValueError, "%zd bytes of %s values do not fit %zd bytes of %s", src.len, source_name,
                     dst.len, target_name);
    } else {
        const Py_ssize_t n = src.len / in_size;
        uint32_t top = 0;
        Py_BEGIN_ALLOW_THREADS
        if (source == F32) {
            top = target == BF16 ? f32_to_bf16(src.buf, dst.buf, n)
                : target == F16  ? f32_to_f16(src.buf, dst.buf, n) : f32_copy(src.buf, dst.buf, n);
        } else if (source == BF16) {
            top = target == F16 ? bf16_to_f16(src.buf, dst.buf, n)
                : target == F32 ? bf16_to_f32(src.buf, dst.buf, n) : bf16_copy(src.buf, dst.buf, n);
        } else {
            top = target == BF16 ? f16_to_bf16(src.buf, dst.buf, n)
                : target == F32  ? f16_to_f32(src.buf, dst.buf, n) : f16_copy(src.buf, dst.buf, n);
        }
        Py_END_ALLOW_THREADS
        result = PyLong_FromLong(top > F32_INF ? -1 : (top < F32_INF && narrows_to_inf(target, top)) ? 1 : 0);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"cast_into", cast_into, METH_VARARGS,
     "cast_into(src, source, dst, target) -> 0 | 1 (a finite value became inf) | -1 (a value is NaN)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_float_cast", "float_cast.py's casts in C", -1, methods};

PyMODINIT_FUNC PyInit__float_cast(void) { return PyModule_Create(&module); }
