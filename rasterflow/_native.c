/*
 * The compiled kernels of rasterflow (rasterflow.compiled loads them; each has a NumPy twin with the same values):
 *   nanmedian, nanquantile  order statistics over time, many pixels at a time through one sorting network (below)
 *   reduce_simple           mean / sum / count / min / max over time in one date-major pass (bottleneck's values)
 *   take, take_add          the per-value table gathers of rasterflow.lookup (an asset's working values, with its
 *                           mask's NaN addends in the same pass)
 *
 * Median and quantiles:
 *
 * fastreduce's NumPy path transposes blocks of pixels to (pixels, t) and sorts each pixel's row (~65 ms for
 * 512^2 x 36 float32 on these machines): a strided transpose, then a branchy sort per 36-value row. Here LANES
 * neighbouring pixels of an image row are loaded date by date into a small date-major scratch (t x LANES keys, in
 * L1), sorted together by one fixed comparator network, and each pixel's median / quantiles are read from the sorted
 * scratch by its valid count (~19 ms for the same series). A comparator is a vector min/max over LANES keys: no
 * branch, no transpose.
 *
 * The network is Batcher's odd-even merge sort for the next power of two >= t, with every comparator that touches
 * a wire >= t dropped (such a wire would hold the largest key and never swap), built once per t.
 *
 * Keys: an IEEE value's bits, with the magnitude bits flipped for negative values, order as two's-complement
 * integers exactly as the values do (-0.0 just below +0.0); integer min/max vectorise without fast-math flags. Any
 * NaN becomes the largest key, so the first `count` sorted keys are the pixel's valid values in ascending order (a
 * valid +inf stays below them). The key map is its own inverse.
 *
 * Exactness: the elements picked are those NumPy picks, and the arithmetic on them is fastreduce's (its module
 * docstring): the even-count median is (a + b) * 0.5 in the input dtype; the quantile lerp is NumPy's, in double,
 * rounded once. Built with -ffp-contract=off so no multiply-add is fused.
 *
 * Buffers come through the buffer protocol (no NumPy headers at build time): the series may be any strided view;
 * the output must be C-contiguous.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#define LANES 32
#define MAX_DATES 4096

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Comparator pairs (lo, hi wire) of the network for t dates, built on first use and kept per t. */
typedef struct {
    int *pairs;
    Py_ssize_t count;
} network_t;

static network_t networks[MAX_DATES + 1];

static int build_network(int t)
{
    if (networks[t].pairs != NULL || t < 2) {
        return 0;
    }
    int n = 1;
    while (n < t) {
        n <<= 1;
    }
    Py_ssize_t capacity = 64;
    Py_ssize_t used = 0;
    int *pairs = malloc(sizeof(int) * 2 * capacity);
    if (pairs == NULL) {
        return -1;
    }
    /* Batcher's odd-even merge sort, iterative form (Knuth, TAOCP 5.3.4, exercise 5.2.2-12 variant). */
    for (int p = 1; p < n; p <<= 1) {
        for (int k = p; k >= 1; k >>= 1) {
            for (int j = k % p; j + k < n; j += 2 * k) {
                for (int i = 0; i < k && i + j + k < n; i++) {
                    int a = i + j, b = i + j + k;
                    if ((a / (2 * p)) != (b / (2 * p))) {
                        continue;
                    }
                    if (b >= t) {
                        continue; /* wire b holds +inf: the comparator never swaps */
                    }
                    if (used == capacity) {
                        capacity *= 2;
                        int *grown = realloc(pairs, sizeof(int) * 2 * capacity);
                        if (grown == NULL) {
                            free(pairs);
                            return -1;
                        }
                        pairs = grown;
                    }
                    pairs[2 * used] = a;
                    pairs[2 * used + 1] = b;
                    used++;
                }
            }
        }
    }
    networks[t].pairs = pairs;
    networks[t].count = used;
    return 0;
}

/* One comparator on LANES pixels at once: the smaller keys to a, the larger to b. With GCC or Clang, as one vector
 * of LANES keys (a blend of a compare mask, which the compiler turns into vector min/max); elsewhere a plain loop.
 * A macro, not an inline function: the vector code must be generated inside each target clone of the caller. */
#if defined(__GNUC__)
#define COMPARE_EXCHANGE(KEY, A, B)                                                                               \
    do {                                                                                                          \
        typedef KEY lanes_t __attribute__((vector_size(32))); /* one AVX2 register, two SSE2 ones */              \
        KEY *a_ = (A), *b_ = (B);                                                                                 \
        for (size_t k = 0; k < LANES * sizeof(KEY); k += sizeof(lanes_t)) {                                       \
            lanes_t x, y;                                                                                         \
            memcpy(&x, (char *)a_ + k, sizeof x);                                                                 \
            memcpy(&y, (char *)b_ + k, sizeof y);                                                                 \
            lanes_t swap = (lanes_t)(y < x);                                                                      \
            lanes_t low = (y & swap) | (x & ~swap);                                                               \
            lanes_t high = (x & swap) | (y & ~swap);                                                              \
            memcpy((char *)a_ + k, &low, sizeof low);                                                             \
            memcpy((char *)b_ + k, &high, sizeof high);                                                           \
        }                                                                                                         \
    } while (0)
#else
#define COMPARE_EXCHANGE(KEY, A, B)                                                                               \
    do {                                                                                                          \
        KEY *a_ = (A), *b_ = (B);                                                                                 \
        for (int k = 0; k < LANES; k++) {                                                                         \
            KEY x = a_[k], y = b_[k];                                                                             \
            a_[k] = y < x ? y : x;                                                                                \
            b_[k] = y < x ? x : y;                                                                                \
        }                                                                                                         \
    } while (0)
#endif

/* One date of LANES pixels from their raw bits to keys in `line` (NaN: the largest key), counting the valid ones.
 * A macro for the same reason as COMPARE_EXCHANGE. */
#if defined(__GNUC__)
#define KEY_LINE(KEY, SHIFT, MAGNITUDE, INF_BITS, BITS, LINE, COUNT)                                              \
    do {                                                                                                          \
        typedef KEY lanes_t __attribute__((vector_size(32)));                                                     \
        for (size_t k = 0; k < LANES * sizeof(KEY); k += sizeof(lanes_t)) {                                       \
            lanes_t raw_, tally_;                                                                                  \
            memcpy(&raw_, (char *)(BITS) + k, sizeof raw_);                                                       \
            memcpy(&tally_, (char *)(COUNT) + k, sizeof tally_);                                                   \
            lanes_t valid_ = (lanes_t)((raw_ & MAGNITUDE) <= INF_BITS); /* -1 where valid */                      \
            lanes_t key_ = raw_ ^ ((raw_ >> SHIFT) & MAGNITUDE);                                                   \
            key_ = (key_ & valid_) | (MAGNITUDE & ~valid_);                                                           \
            tally_ -= valid_;                                                                                       \
            memcpy((char *)(LINE) + k, &key_, sizeof key_);                                                         \
            memcpy((char *)(COUNT) + k, &tally_, sizeof tally_);                                                    \
        }                                                                                                         \
    } while (0)
#else
#define KEY_LINE(KEY, SHIFT, MAGNITUDE, INF_BITS, BITS, LINE, COUNT)                                              \
    do {                                                                                                          \
        for (int k = 0; k < LANES; k++) {                                                                         \
            KEY b_ = (BITS)[k];                                                                                   \
            KEY valid = (b_ & MAGNITUDE) <= INF_BITS;                                                             \
            (COUNT)[k] += valid;                                                                                  \
            (LINE)[k] = valid ? (b_ ^ ((b_ >> SHIFT) & MAGNITUDE)) : MAGNITUDE;                                   \
        }                                                                                                         \
    } while (0)
#endif

/* The median and quantile kernels of one float type and its integer key (see the header). `>>` of a negative key is
 * the arithmetic shift on every compiler CPython supports. */
#define DEFINE_REDUCE(NAME, TYPE, KEY, SHIFT, MAGNITUDE, INF_BITS)                                               \
    VECTOR_CLONES static void NAME##_network(KEY *scratch, const int *pairs, Py_ssize_t ncomp)                   \
    {                                                                                                             \
        for (Py_ssize_t c = 0; c < ncomp; c++) {                                                                  \
            COMPARE_EXCHANGE(KEY, scratch + (Py_ssize_t)pairs[2 * c] * LANES,                                     \
                             scratch + (Py_ssize_t)pairs[2 * c + 1] * LANES);                                     \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    static inline KEY NAME##_flip(KEY bits) { return bits ^ ((bits >> SHIFT) & MAGNITUDE); }                     \
                                                                                                                  \
    static inline TYPE NAME##_value(KEY key)                                                                      \
    {                                                                                                             \
        KEY bits = NAME##_flip(key);                                                                              \
        TYPE v;                                                                                                   \
        memcpy(&v, &bits, sizeof v);                                                                              \
        return v;                                                                                                 \
    }                                                                                                             \
                                                                                                                  \
    /* LANES pixels of one image row from column c0 into the date-major scratch as keys (NaN and the lanes past */ \
    /* the row's end as the largest key), counting each pixel's valid dates. */                                   \
    VECTOR_CLONES static void NAME##_load(const char *src, Py_ssize_t t, Py_ssize_t s_date, Py_ssize_t s_col,    \
                                          int lanes, KEY *scratch, KEY *count)                                   \
    {                                                                                                             \
        KEY bits[LANES];                                                                                          \
        for (int k = 0; k < LANES; k++) {                                                                         \
            count[k] = 0;                                                                                         \
            bits[k] = MAGNITUDE;                                                                                  \
        }                                                                                                         \
        for (Py_ssize_t d = 0; d < t; d++) {                                                                      \
            const char *base = src + d * s_date;                                                                  \
            if (s_col == (Py_ssize_t)sizeof(TYPE) && lanes == LANES) {                                            \
                memcpy(bits, base, sizeof bits); /* a fixed size: inlined, no call */                             \
            } else if (s_col == (Py_ssize_t)sizeof(TYPE)) {                                                       \
                memcpy(bits, base, (size_t)lanes * sizeof(TYPE));                                                 \
            } else {                                                                                              \
                for (int k = 0; k < lanes; k++) {                                                                 \
                    memcpy(bits + k, base + k * s_col, sizeof(TYPE));                                             \
                }                                                                                                 \
            }                                                                                                     \
            KEY_LINE(KEY, SHIFT, MAGNITUDE, INF_BITS, bits, scratch + d * LANES, count);                          \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    /* Every pixel: load LANES of them, sort their keys, read each one's median from its valid count. */      \
    static void NAME##_median(const char *src, Py_ssize_t t, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t s_date, \
                              Py_ssize_t s_row, Py_ssize_t s_col, TYPE *out, const int *pairs, Py_ssize_t ncomp, \
                              KEY *scratch)                                                                       \
    {                                                                                                             \
        KEY count[LANES];                                                                                         \
        const TYPE half = (TYPE)0.5;                                                                              \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                                   \
            for (Py_ssize_t c0 = 0; c0 < cols; c0 += LANES) {                                                     \
                int lanes = (int)(cols - c0 < LANES ? cols - c0 : LANES);                                         \
                NAME##_load(src + r * s_row + c0 * s_col, t, s_date, s_col, lanes, scratch, count);               \
                NAME##_network(scratch, pairs, ncomp);                                                            \
                TYPE *target = out + r * cols + c0;                                                               \
                for (int k = 0; k < lanes; k++) {                                                                 \
                    Py_ssize_t valid = (Py_ssize_t)count[k];                                                      \
                    if (valid == 0) {                                                                             \
                        target[k] = (TYPE)NAN;                                                                    \
                        continue;                                                                                 \
                    }                                                                                             \
                    TYPE low = NAME##_value(scratch[((valid - 1) / 2) * LANES + k]);                              \
                    if (valid & 1) {                                                                              \
                        target[k] = low; /* the middle element itself, as NumPy and bottleneck */                 \
                    } else {                                                                                      \
                        TYPE high = NAME##_value(scratch[(valid / 2) * LANES + k]);                               \
                        target[k] = (low + high) * half; /* NumPy's mean of the two: (a + b) / 2 */               \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    static void NAME##_quantiles(const char *src, Py_ssize_t t, Py_ssize_t rows, Py_ssize_t cols,                 \
                                 Py_ssize_t s_date, Py_ssize_t s_row, Py_ssize_t s_col, TYPE *out,                \
                                 const double *quantiles, Py_ssize_t nq, const int *pairs, Py_ssize_t ncomp,      \
                                 KEY *scratch)                                                                    \
    {                                                                                                             \
        KEY count[LANES];                                                                                         \
        Py_ssize_t pixels = rows * cols;                                                                          \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                                   \
            for (Py_ssize_t c0 = 0; c0 < cols; c0 += LANES) {                                                     \
                int lanes = (int)(cols - c0 < LANES ? cols - c0 : LANES);                                         \
                NAME##_load(src + r * s_row + c0 * s_col, t, s_date, s_col, lanes, scratch, count);               \
                NAME##_network(scratch, pairs, ncomp);                                                            \
                for (Py_ssize_t q = 0; q < nq; q++) {                                                             \
                    TYPE *target = out + q * pixels + r * cols + c0;                                              \
                    for (int k = 0; k < lanes; k++) {                                                             \
                        Py_ssize_t valid = (Py_ssize_t)count[k];                                                  \
                        if (valid == 0) {                                                                         \
                            target[k] = (TYPE)NAN;                                                                \
                            continue;                                                                             \
                        }                                                                                         \
                        /* np.nanquantile's "linear" method for a list of quantiles: the weight and the lerp in */ \
                        /* double, b - a in the input dtype, one rounding at the end */                          \
                        Py_ssize_t last = valid - 1;                                                              \
                        double position = quantiles[q] * (double)last;                                            \
                        Py_ssize_t low = (Py_ssize_t)floor(position);                                             \
                        Py_ssize_t high = low + 1 < last ? low + 1 : last;                                        \
                        double fraction = position - (double)low;                                                 \
                        TYPE below = NAME##_value(scratch[low * LANES + k]);                                      \
                        TYPE above = NAME##_value(scratch[high * LANES + k]);                                     \
                        double diff = (double)(TYPE)(above - below);                                              \
                        double lerp = fraction >= 0.5 ? (double)above - diff * (1.0 - fraction)                   \
                                                      : (double)below + diff * fraction;                          \
                        target[k] = (TYPE)lerp;                                                                   \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }

DEFINE_REDUCE(reduce_float, float, int32_t, 31, INT32_MAX, INT32_C(0x7F800000))
DEFINE_REDUCE(reduce_double, double, int64_t, 63, INT64_MAX, INT64_C(0x7FF0000000000000))

/* Whether a buffer's struct format is the one native-order code `want` ('<' / '>' count as native only where
 * they are the machine's order). */
static int has_format(const char *format, char want)
{
    if (format == NULL) {
        return 0;
    }
    if (format[0] == '=' || format[0] == '@' || (format[0] == '<' && PY_LITTLE_ENDIAN) ||
        (format[0] == '>' && !PY_LITTLE_ENDIAN)) {
        format++;
    }
    return format[0] == want && format[1] == '\0';
}

/* The source (t, rows, cols) float buffer and the C-contiguous output of `per_pixel` values a pixel, checked. */
static int open_buffers(PyObject *src_obj, PyObject *out_obj, Py_ssize_t per_pixel, Py_buffer *src, Py_buffer *out,
                        int *is_float)
{
    if (PyObject_GetBuffer(src_obj, src, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(out_obj, out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(src);
        return -1;
    }
    *is_float = has_format(src->format, 'f');
    if (src->ndim != 3 || !(*is_float || has_format(src->format, 'd'))) {
        PyErr_SetString(PyExc_TypeError, "the series must be a 3-D float32 or float64 (t, rows, cols) buffer");
    } else if (src->shape[0] < 1 || src->shape[0] > MAX_DATES) {
        PyErr_Format(PyExc_ValueError, "%zd dates: 1 to %d are supported", src->shape[0], MAX_DATES);
    } else if (!has_format(out->format, *is_float ? 'f' : 'd') ||
               out->len != per_pixel * src->shape[1] * src->shape[2] * src->itemsize) {
        PyErr_Format(PyExc_ValueError, "the output must be C-contiguous, of the series' dtype, %zd values a pixel",
                     per_pixel);
    } else if (build_network((int)src->shape[0]) < 0) {
        PyErr_NoMemory();
    } else {
        return 0;
    }
    PyBuffer_Release(src);
    PyBuffer_Release(out);
    return -1;
}

static PyObject *nanmedian(PyObject *self, PyObject *args)
{
    PyObject *src_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OO:nanmedian", &src_obj, &out_obj)) {
        return NULL;
    }
    Py_buffer src, out;
    int is_float;
    if (open_buffers(src_obj, out_obj, 1, &src, &out, &is_float) < 0) {
        return NULL;
    }
    Py_ssize_t t = src.shape[0];
    void *scratch = malloc((size_t)t * LANES * (size_t)src.itemsize);
    if (scratch == NULL) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    const int *pairs = networks[t].pairs;
    Py_ssize_t ncomp = networks[t].count;
    Py_BEGIN_ALLOW_THREADS
    if (is_float) {
        reduce_float_median((const char *)src.buf, t, src.shape[1], src.shape[2], src.strides[0], src.strides[1],
                            src.strides[2], (float *)out.buf, pairs, ncomp, (int32_t *)scratch);
    } else {
        reduce_double_median((const char *)src.buf, t, src.shape[1], src.shape[2], src.strides[0], src.strides[1],
                             src.strides[2], (double *)out.buf, pairs, ncomp, (int64_t *)scratch);
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyObject *nanquantile(PyObject *self, PyObject *args)
{
    PyObject *src_obj, *quantile_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:nanquantile", &src_obj, &quantile_obj, &out_obj)) {
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(quantile_obj, "quantiles must be a sequence of floats");
    if (sequence == NULL) {
        return NULL;
    }
    Py_ssize_t nq = PySequence_Fast_GET_SIZE(sequence);
    double *quantiles = malloc(sizeof(double) * (size_t)(nq > 0 ? nq : 1));
    if (quantiles == NULL) {
        Py_DECREF(sequence);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nq; i++) {
        quantiles[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(sequence, i));
        if (quantiles[i] == -1.0 && PyErr_Occurred()) {
            free(quantiles);
            Py_DECREF(sequence);
            return NULL;
        }
        if (!(quantiles[i] >= 0.0 && quantiles[i] <= 1.0)) {
            PyErr_Format(PyExc_ValueError, "quantile %R is outside [0, 1]", PySequence_Fast_GET_ITEM(sequence, i));
            free(quantiles);
            Py_DECREF(sequence);
            return NULL;
        }
    }
    Py_DECREF(sequence);
    Py_buffer src, out;
    int is_float;
    if (open_buffers(src_obj, out_obj, nq, &src, &out, &is_float) < 0) {
        free(quantiles);
        return NULL;
    }
    Py_ssize_t t = src.shape[0];
    void *scratch = malloc((size_t)t * LANES * (size_t)src.itemsize);
    if (scratch == NULL) {
        free(quantiles);
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    const int *pairs = networks[t].pairs;
    Py_ssize_t ncomp = networks[t].count;
    Py_BEGIN_ALLOW_THREADS
    if (is_float) {
        reduce_float_quantiles((const char *)src.buf, t, src.shape[1], src.shape[2], src.strides[0],
                               src.strides[1], src.strides[2], (float *)out.buf, quantiles, nq, pairs, ncomp,
                               (int32_t *)scratch);
    } else {
        reduce_double_quantiles((const char *)src.buf, t, src.shape[1], src.shape[2], src.strides[0],
                                src.strides[1], src.strides[2], (double *)out.buf, quantiles, nq, pairs, ncomp,
                                (int64_t *)scratch);
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    free(quantiles);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* One-pass reductions over time, date-major: every pixel of an image row at once, date after date (the series
 * is read in its own order, and each pixel's dates are visited in order, as bottleneck visits them). Per pixel:
 *   mean  sum / count in the input dtype (bottleneck's nanmean: a sum in the input dtype, divided by the count)
 *   sum   the sum (NaN where no date is valid; bottleneck's nansum, then NaN for "no observation")
 *   count the valid dates
 *   min   the last valid value <= every earlier one (bottleneck's nanmin: `if (ai <= amin) amin = ai`)
 *   max   likewise with >=
 * A NaN date adds -0.0 (x + -0.0 is x for every x, zeros included), which is skipping it. */
enum { REDUCE_MEAN, REDUCE_SUM, REDUCE_COUNT, REDUCE_MIN, REDUCE_MAX };

#define DEFINE_SIMPLE(NAME, TYPE, KEY, MAGNITUDE, INF_BITS)                                                                               \
    VECTOR_CLONES static void NAME(const char *src, Py_ssize_t t, Py_ssize_t rows, Py_ssize_t cols,              \
                                   Py_ssize_t s_date, Py_ssize_t s_row, Py_ssize_t s_col, TYPE *out, int method,  \
                                   TYPE *acc, TYPE *count, TYPE *line)                                            \
    {                                                                                                             \
        const TYPE start = method == REDUCE_MIN ? (TYPE)INFINITY : method == REDUCE_MAX ? -(TYPE)INFINITY : 0;    \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                                   \
            for (Py_ssize_t c = 0; c < cols; c++) {                                                               \
                acc[c] = start;                                                                                   \
                count[c] = 0;                                                                                     \
            }                                                                                                     \
            for (Py_ssize_t d = 0; d < t; d++) {                                                                  \
                const char *base = src + d * s_date + r * s_row;                                                  \
                const TYPE *values = (const TYPE *)base;                                                          \
                if (s_col != (Py_ssize_t)sizeof(TYPE)) {                                                          \
                    for (Py_ssize_t c = 0; c < cols; c++) {                                                       \
                        memcpy(line + c, base + c * s_col, sizeof(TYPE));                                         \
                    }                                                                                             \
                    values = line;                                                                                \
                }                                                                                                 \
                if (method == REDUCE_MIN) {                                                                       \
                    for (Py_ssize_t c = 0; c < cols; c++) {                                                       \
                        TYPE v = values[c];                                                                       \
                        count[c] += v == v;                                                                       \
                        acc[c] = v <= acc[c] ? v : acc[c];                                                        \
                    }                                                                                             \
                } else if (method == REDUCE_MAX) {                                                                \
                    for (Py_ssize_t c = 0; c < cols; c++) {                                                       \
                        TYPE v = values[c];                                                                       \
                        count[c] += v == v;                                                                       \
                        acc[c] = v >= acc[c] ? v : acc[c];                                                        \
                    }                                                                                             \
                } else {                                                                                          \
                    /* on the bits: a float select with a NaN test compiles to a branch, integer masks vectorise */ \
                    for (Py_ssize_t c = 0; c < cols; c++) {                                                       \
                        KEY bits;                                                                                 \
                        memcpy(&bits, values + c, sizeof bits);                                                   \
                        KEY valid = -(KEY)((bits & MAGNITUDE) <= INF_BITS);                                       \
                        KEY kept = (bits & valid) | (~MAGNITUDE & ~valid); /* NaN: -0.0 */                        \
                        TYPE addend;                                                                              \
                        memcpy(&addend, &kept, sizeof addend);                                                    \
                        count[c] += (TYPE)(valid & 1);                                                            \
                        acc[c] += addend;                                                                         \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
            TYPE *target = out + r * cols;                                                                        \
            for (Py_ssize_t c = 0; c < cols; c++) {                                                               \
                TYPE n = count[c];                                                                                \
                TYPE value = method == REDUCE_COUNT ? n : method == REDUCE_MEAN ? acc[c] / n : acc[c];            \
                target[c] = method != REDUCE_COUNT && n == 0 ? (TYPE)NAN : value;                                 \
            }                                                                                                     \
        }                                                                                                         \
    }

DEFINE_SIMPLE(simple_float, float, int32_t, INT32_MAX, INT32_C(0x7F800000))
DEFINE_SIMPLE(simple_double, double, int64_t, INT64_MAX, INT64_C(0x7FF0000000000000))

static PyObject *reduce_simple(PyObject *self, PyObject *args)
{
    PyObject *src_obj, *out_obj;
    const char *method_name;
    if (!PyArg_ParseTuple(args, "OsO:reduce_simple", &src_obj, &method_name, &out_obj)) {
        return NULL;
    }
    static const char *names[] = {"mean", "sum", "count", "min", "max"};
    int method = -1;
    for (int m = 0; m < 5; m++) {
        if (strcmp(method_name, names[m]) == 0) {
            method = m;
        }
    }
    if (method < 0) {
        PyErr_Format(PyExc_ValueError, "reduce_simple: unknown method %s", method_name);
        return NULL;
    }
    Py_buffer src, out;
    int is_float;
    if (open_buffers(src_obj, out_obj, 1, &src, &out, &is_float) < 0) {
        return NULL;
    }
    Py_ssize_t t = src.shape[0], rows = src.shape[1], cols = src.shape[2];
    void *scratch = malloc((size_t)(3 * (cols > 0 ? cols : 1)) * (size_t)src.itemsize);
    if (scratch == NULL) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    if (is_float) {
        float *f = (float *)scratch;
        simple_float((const char *)src.buf, t, rows, cols, src.strides[0], src.strides[1], src.strides[2],
                     (float *)out.buf, method, f, f + cols, f + 2 * cols);
    } else {
        double *f = (double *)scratch;
        simple_double((const char *)src.buf, t, rows, cols, src.strides[0], src.strides[1], src.strides[2],
                      (double *)out.buf, method, f, f + cols, f + 2 * cols);
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* out[i] = table[index[i]] for a uint8 / uint16 index: rasterflow.lookup's per-value tables (a raw plane to its
 * working values, a mask asset to its NaN addends). np.take casts the index to intp first and checks every
 * element's bounds; a table of every value of the index's dtype needs neither. */
#define DEFINE_TAKE(NAME, TYPE, INDEX)                                                                            \
    static void NAME(const TYPE *table, const INDEX *index, TYPE *out, Py_ssize_t n)                              \
    {                                                                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                                                      \
            out[i] = table[index[i]];                                                                             \
        }                                                                                                         \
    }

DEFINE_TAKE(take_float_u8, float, uint8_t)
DEFINE_TAKE(take_float_u16, float, uint16_t)
DEFINE_TAKE(take_double_u8, double, uint8_t)
DEFINE_TAKE(take_double_u16, double, uint16_t)

/* The same with a second table's entries added: an asset's working values plus its mask's NaN / -0.0 addends in
 * one pass (no addend plane written and read back). The sum is the dtype's own addition, as NumPy's `+=`. */
#define DEFINE_TAKE_ADD(NAME, TYPE, INDEX, ADDEND_INDEX)                                                          \
    static void NAME(const TYPE *table, const INDEX *index, const TYPE *addends, const ADDEND_INDEX *which,       \
                     TYPE *out, Py_ssize_t n)                                                                     \
    {                                                                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                                                      \
            out[i] = table[index[i]] + addends[which[i]];                                                         \
        }                                                                                                         \
    }

DEFINE_TAKE_ADD(take_add_float_u8_u8, float, uint8_t, uint8_t)
DEFINE_TAKE_ADD(take_add_float_u8_u16, float, uint8_t, uint16_t)
DEFINE_TAKE_ADD(take_add_float_u16_u8, float, uint16_t, uint8_t)
DEFINE_TAKE_ADD(take_add_float_u16_u16, float, uint16_t, uint16_t)
DEFINE_TAKE_ADD(take_add_double_u8_u8, double, uint8_t, uint8_t)
DEFINE_TAKE_ADD(take_add_double_u8_u16, double, uint8_t, uint16_t)
DEFINE_TAKE_ADD(take_add_double_u16_u8, double, uint16_t, uint8_t)
DEFINE_TAKE_ADD(take_add_double_u16_u16, double, uint16_t, uint16_t)

/* A table and its index, checked: the table holds every value of the index's dtype. Sets *wide for uint16. */
static int open_table(PyObject *table_obj, PyObject *index_obj, Py_buffer *table, Py_buffer *index, int *is_float,
                      int *wide)
{
    if (PyObject_GetBuffer(table_obj, table, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(index_obj, index, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(table);
        return -1;
    }
    *is_float = has_format(table->format, 'f');
    int is_u8 = has_format(index->format, 'B');
    *wide = has_format(index->format, 'H');
    if (!(*is_float || has_format(table->format, 'd')) || !(is_u8 || *wide)) {
        PyErr_SetString(PyExc_TypeError, "take: a float32/float64 table and a uint8/uint16 index");
    } else if (table->len / table->itemsize != (is_u8 ? 256 : 65536)) {
        PyErr_SetString(PyExc_ValueError, "take: the table must hold every value of the index's dtype");
    } else {
        return 0;
    }
    PyBuffer_Release(table);
    PyBuffer_Release(index);
    return -1;
}

static PyObject *take_add(PyObject *self, PyObject *args)
{
    PyObject *table_obj, *index_obj, *addend_obj, *which_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:take_add", &table_obj, &index_obj, &addend_obj, &which_obj, &out_obj)) {
        return NULL;
    }
    Py_buffer table, index, addends, which, out;
    int is_float, wide, addend_float, addend_wide;
    if (open_table(table_obj, index_obj, &table, &index, &is_float, &wide) < 0) {
        return NULL;
    }
    if (open_table(addend_obj, which_obj, &addends, &which, &addend_float, &addend_wide) < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&index);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&index);
        PyBuffer_Release(&addends);
        PyBuffer_Release(&which);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = index.len / index.itemsize;
    if (addend_float != is_float || which.len / which.itemsize != n) {
        PyErr_SetString(PyExc_ValueError, "take_add: the tables must share a dtype and the indexes a size");
    } else if (!has_format(out.format, is_float ? 'f' : 'd') || out.len != n * table.itemsize) {
        PyErr_SetString(PyExc_ValueError, "take_add: the output must be C-contiguous, of the table's dtype and the index's size");
    } else {
        int kind = (is_float ? 0 : 4) + (wide ? 2 : 0) + (addend_wide ? 1 : 0);
        Py_BEGIN_ALLOW_THREADS
        switch (kind) {
#define TAKE_ADD_CASE(K, NAME, TYPE, I1, I2)                                                                      \
    case K:                                                                                                       \
        NAME((const TYPE *)table.buf, (const I1 *)index.buf, (const TYPE *)addends.buf, (const I2 *)which.buf,    \
             (TYPE *)out.buf, n);                                                                                 \
        break;
            TAKE_ADD_CASE(0, take_add_float_u8_u8, float, uint8_t, uint8_t)
            TAKE_ADD_CASE(1, take_add_float_u8_u16, float, uint8_t, uint16_t)
            TAKE_ADD_CASE(2, take_add_float_u16_u8, float, uint16_t, uint8_t)
            TAKE_ADD_CASE(3, take_add_float_u16_u16, float, uint16_t, uint16_t)
            TAKE_ADD_CASE(4, take_add_double_u8_u8, double, uint8_t, uint8_t)
            TAKE_ADD_CASE(5, take_add_double_u8_u16, double, uint8_t, uint16_t)
            TAKE_ADD_CASE(6, take_add_double_u16_u8, double, uint16_t, uint8_t)
            TAKE_ADD_CASE(7, take_add_double_u16_u16, double, uint16_t, uint16_t)
#undef TAKE_ADD_CASE
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
    PyBuffer_Release(&table);
    PyBuffer_Release(&index);
    PyBuffer_Release(&addends);
    PyBuffer_Release(&which);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *take(PyObject *self, PyObject *args)
{
    PyObject *table_obj, *index_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:take", &table_obj, &index_obj, &out_obj)) {
        return NULL;
    }
    Py_buffer table, index, out;
    int is_float, wide;
    if (open_table(table_obj, index_obj, &table, &index, &is_float, &wide) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&index);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = index.len / index.itemsize;
    if (!has_format(out.format, is_float ? 'f' : 'd') || out.len != n * table.itemsize) {
        PyErr_SetString(PyExc_ValueError, "take: the output must be C-contiguous, of the table's dtype and the index's size");
    } else {
        Py_BEGIN_ALLOW_THREADS
        if (is_float && !wide) {
            take_float_u8((const float *)table.buf, (const uint8_t *)index.buf, (float *)out.buf, n);
        } else if (is_float) {
            take_float_u16((const float *)table.buf, (const uint16_t *)index.buf, (float *)out.buf, n);
        } else if (!wide) {
            take_double_u8((const double *)table.buf, (const uint8_t *)index.buf, (double *)out.buf, n);
        } else {
            take_double_u16((const double *)table.buf, (const uint16_t *)index.buf, (double *)out.buf, n);
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
    PyBuffer_Release(&table);
    PyBuffer_Release(&index);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *comparators(PyObject *self, PyObject *args)
{
    int t;
    if (!PyArg_ParseTuple(args, "i:comparators", &t)) {
        return NULL;
    }
    if (t < 1 || t > MAX_DATES) {
        PyErr_Format(PyExc_ValueError, "comparators: %d dates, 1 to %d supported", t, MAX_DATES);
        return NULL;
    }
    if (build_network(t) < 0) {
        return PyErr_NoMemory();
    }
    return PyLong_FromSsize_t(t < 2 ? 0 : networks[t].count);
}

/* One pass over the values a statistics block holds: NaN and nodata skipped, the rest summed in double left to
 * right (NumPy's twin: np.cumsum of the valid values as float64), min / max the first of equal values. nodata is
 * compared as NumPy compares an array with a Python float: in the array's type for floats, as double for integers. */
#define STATS_PASS(T, NODATA_T)                                                                                    \
    {                                                                                                              \
        const T *p = (const T *)values.buf;                                                                        \
        const NODATA_T nd = (NODATA_T)nodata;                                                                      \
        for (Py_ssize_t i = 0; i < n; i++) {                                                                       \
            const T raw = p[i];                                                                                    \
            if (raw != raw || (has_nodata && (NODATA_T)raw == nd)) {                                               \
                continue;                                                                                          \
            }                                                                                                      \
            const double v = (double)raw;                                                                          \
            count++;                                                                                               \
            sum += v;                                                                                              \
            sumsq += v * v;                                                                                        \
            if (v < lo) {                                                                                          \
                lo = v;                                                                                            \
            }                                                                                                      \
            if (v > hi) {                                                                                          \
                hi = v;                                                                                            \
            }                                                                                                      \
        }                                                                                                          \
    }

static PyObject *block_stats(PyObject *self, PyObject *args)
{
    PyObject *values_obj, *nodata_obj;
    if (!PyArg_ParseTuple(args, "OO:block_stats", &values_obj, &nodata_obj)) {
        return NULL;
    }
    int has_nodata = nodata_obj != Py_None;
    double nodata = 0.0;
    if (has_nodata) {
        nodata = PyFloat_AsDouble(nodata_obj);
        if (nodata == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        has_nodata = nodata == nodata; /* NaN nodata: the NaN test covers it */
    }
    Py_buffer values;
    if (PyObject_GetBuffer(values_obj, &values, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    const char *format = values.format;
    char code = 0;
    const char *codes = "fdbBhHiI";
    for (const char *c = codes; *c; c++) {
        if (has_format(format, *c)) {
            code = *c;
        }
    }
    if (!code) {
        PyBuffer_Release(&values);
        PyErr_SetString(PyExc_TypeError, "block_stats: float32/64 or 8-32 bit integer values");
        return NULL;
    }
    Py_ssize_t n = values.len / values.itemsize, count = 0;
    double sum = 0.0, sumsq = 0.0, lo = INFINITY, hi = -INFINITY;
    Py_BEGIN_ALLOW_THREADS
    switch (code) {
    case 'f': STATS_PASS(float, float) break;
    case 'd': STATS_PASS(double, double) break;
    case 'b': STATS_PASS(int8_t, double) break;
    case 'B': STATS_PASS(uint8_t, double) break;
    case 'h': STATS_PASS(int16_t, double) break;
    case 'H': STATS_PASS(uint16_t, double) break;
    case 'i': STATS_PASS(int32_t, double) break;
    default: STATS_PASS(uint32_t, double) break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    return Py_BuildValue("(ndddd)", count, sum, sumsq, lo, hi);
}

/* TIFF's horizontal predictor (2) undone for one decoded 16-bit tile: each row's values are the running sums of its
 * differences (modulo 2^16, as libtiff and imagecodecs add), stored for rows [y0, y1) and columns [x0, x1) into the
 * window `out` (rows `out_stride` bytes apart). With SSE2, eight values at a time by a log-step scan in the register
 * plus the carry of the eight before (a scalar row is one add per value, each waiting for the last). */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_PREDICTED_TILE_WIDTH 4096 /* the scratch row on the stack; wider tiles are left to imagecodecs */

static void undo_rows_u16(const uint16_t *tile, Py_ssize_t width, Py_ssize_t y0, Py_ssize_t y1, Py_ssize_t x0,
                          Py_ssize_t x1, char *out, Py_ssize_t out_stride)
{
    uint16_t row[MAX_PREDICTED_TILE_WIDTH + 8];
    for (Py_ssize_t y = y0; y < y1; y++) {
        const uint16_t *src = tile + y * width;
        uint16_t *dst = (uint16_t *)(out + (y - y0) * out_stride);
        /* whole rows up to x1 into the scratch row, then the window's columns out of it */
        int direct = x0 == 0;
        uint16_t *sums = direct ? dst : row;
        Py_ssize_t x = 0;
#if defined(__SSE2__)
        __m128i carry = _mm_setzero_si128();
        for (; x + 8 <= x1; x += 8) {
            __m128i v = _mm_loadu_si128((const __m128i *)(src + x));
            v = _mm_add_epi16(v, _mm_slli_si128(v, 2));
            v = _mm_add_epi16(v, _mm_slli_si128(v, 4));
            v = _mm_add_epi16(v, _mm_slli_si128(v, 8));
            v = _mm_add_epi16(v, carry);
            _mm_storeu_si128((__m128i *)(sums + x), v);
            carry = _mm_shufflehi_epi16(v, 0xFF);        /* lane 7 into lanes 4-7 */
            carry = _mm_unpackhi_epi64(carry, carry);    /* and into all eight */
        }
        uint16_t sum = x ? sums[x - 1] : 0;
#else
        uint16_t sum = 0;
#endif
        for (; x < x1; x++) {
            sum = (uint16_t)(sum + src[x]);
            sums[x] = sum;
        }
        if (!direct) {
            memcpy(dst, row + x0, (size_t)(x1 - x0) * sizeof(uint16_t));
        }
    }
}

static PyObject *undo_horizontal_u16(PyObject *self, PyObject *args)
{
    PyObject *tile_obj, *out_obj;
    Py_ssize_t height, width, y0, x0;
    if (!PyArg_ParseTuple(args, "OnnnnO:undo_horizontal_u16", &tile_obj, &height, &width, &y0, &x0, &out_obj)) {
        return NULL;
    }
    Py_buffer tile, out;
    if (PyObject_GetBuffer(tile_obj, &tile, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&tile);
        return NULL;
    }
    PyObject *result = NULL;
    int two_byte = has_format(out.format, 'H') || has_format(out.format, 'h');
    if (!two_byte || out.ndim != 2 || out.strides[1] != 2 || height < 0 || width < 0 || width > MAX_PREDICTED_TILE_WIDTH ||
        tile.len < height * width * 2 || y0 < 0 || x0 < 0 || y0 + out.shape[0] > height ||
        x0 + out.shape[1] > width) {
        PyErr_SetString(PyExc_ValueError, "undo_horizontal_u16: a 16-bit (rows, cols) window with contiguous rows "
                                          "inside a tile of height x width (at most 4096) 16-bit values");
    } else {
        Py_BEGIN_ALLOW_THREADS
        undo_rows_u16((const uint16_t *)tile.buf, width, y0, y0 + out.shape[0], x0, x0 + out.shape[1],
                      (char *)out.buf, out.strides[0]);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
    PyBuffer_Release(&tile);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"nanmedian", nanmedian, METH_VARARGS,
     "nanmedian(series, out): the NaN-ignoring median over axis 0 of a (t, rows, cols) float32/float64 series into "
     "the C-contiguous out of rows * cols values (NaN where no date is valid); np.nanmedian's values."},
    {"nanquantile", nanquantile, METH_VARARGS,
     "nanquantile(series, quantiles, out): np.nanquantile(series, list(quantiles), axis=0) (method linear) into the "
     "C-contiguous out of len(quantiles) * rows * cols values."},
    {"reduce_simple", reduce_simple, METH_VARARGS,
     "reduce_simple(series, method, out): mean / sum / count / min / max over axis 0 of a (t, rows, cols) "
     "float32/float64 series, NaN ignored, into the C-contiguous out of rows * cols values (bottleneck's values; "
     "NaN where no date is valid, except count)."},
    {"take", take, METH_VARARGS,
     "take(table, index, out): out = table[index] for a float32/float64 table of every value of the uint8/uint16 "
     "index's dtype; all C-contiguous."},
    {"take_add", take_add, METH_VARARGS,
     "take_add(table, index, addends, which, out): out = table[index] + addends[which], both tables of every value "
     "of their uint8/uint16 index's dtype, of one float dtype; all C-contiguous."},
    {"comparators", comparators, METH_VARARGS, "comparators(t): the number of comparators of the network for t dates."},
    {"undo_horizontal_u16", undo_horizontal_u16, METH_VARARGS,
     "undo_horizontal_u16(tile, height, width, y0, x0, out): TIFF's horizontal predictor undone for a decoded tile of "
     "height x width 16-bit differences, rows [y0, y0 + out rows) and columns [x0, x0 + out cols) stored into the 16-bit "
     "window out (contiguous rows, any row stride)."},
    {"block_stats", block_stats, METH_VARARGS,
     "block_stats(values, nodata): (count, sum, sum of squares, min, max) of the C-contiguous values that are neither "
     "NaN nor nodata (None: none), summed in double left to right."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "Compiled kernels of rasterflow: the sorting network of fastreduce, the gathers of lookup.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_PREDICTED_TILE_WIDTH", MAX_PREDICTED_TILE_WIDTH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
