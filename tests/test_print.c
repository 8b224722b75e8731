/*
 * test_print.c — em_tensor_format / em_tensor_print against the text PyTorch 1.13 prints.
 *
 * Every expected string below was produced by PyTorch 1.13.1 (Debian's python3-torch) with
 * the script at the end of this comment: PyTorch's own _tensor_str() gives the values part and
 * its own _add_suffixes() lays out the suffixes, with Ember's suffixes in place of PyTorch's
 * (", dtype=X" whenever the dtype is not float32 — int64 and bool included — and
 * ", shape=[...]" for tensors with at least one dim). Each test names the torch expression.
 * The same values are built here with em_from_data on em_cpu().
 *
 *     import torch
 *     from torch._tensor_str import _tensor_str, _add_suffixes
 *     def ember_repr(t):
 *         body = "[]" if t.numel() == 0 else _tensor_str(t, 7)
 *         suffixes = []
 *         if t.dtype != torch.float32:
 *             suffixes.append("dtype=" + str(t.dtype).replace("torch.", ""))
 *         if t.dim() > 0:
 *             suffixes.append("shape=[" + ", ".join(str(s) for s in t.shape) + "]")
 *         return _add_suffixes("tensor(" + body, suffixes, 7, False)
 *     nan, inf = float("nan"), float("inf")
 *     print(ember_repr(torch.tensor([0.1, -2.0, 3.5, 4.25])))   # and so on, per test
 *     torch.set_printoptions(precision=2)                     # for the options tests
 *
 * For float32 CPU tensors the result is exactly repr(t) with ", shape=[...]" added.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

static void setup(void) {
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
    em_print_options_set(NULL);
}

static void teardown(void) {
    em_print_options_set(NULL);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

TestSuite(print, .init = setup, .fini = teardown);

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static em_tensor *make(const void *data, em_dtype dt, int ndim, const int64_t *shape) {
    em_tensor *t = em_from_data(data, ndim, shape, dt, em_cpu());
    cr_assert_not_null(t, "em_from_data: %s", em_last_error());
    return t;
}

/* em_tensor_format and em_tensor_print (which adds a newline) both give `want`; releases t. */
static void expect_text(em_tensor *t, const char *want) {
    cr_assert_not_null(t, "%s", em_last_error());
    size_t need = em_tensor_format(t, NULL, 0);
    cr_assert_eq(need, strlen(want), "length %zu, want %zu for:\n%s", need, strlen(want), want);
    char *got = malloc(need + 1);
    cr_assert_not_null(got);
    cr_assert_eq(em_tensor_format(t, got, need + 1), need);
    cr_assert_str_eq(got, want, "\ngot:\n%s\nwant:\n%s", got, want);
    free(got);

    char *printed = NULL;
    size_t printed_len = 0;
    FILE *f = open_memstream(&printed, &printed_len);
    cr_assert_not_null(f);
    cr_assert_eq(em_tensor_print(f, t), EM_OK, "%s", em_last_error());
    fclose(f);
    cr_assert_eq(printed_len, need + 1);
    cr_assert_eq(strncmp(printed, want, need), 0, "printed:\n%s", printed);
    cr_assert_eq(printed[need], '\n');
    free(printed);
    em_tensor_release(t);
}

/* ---- scalars and vectors ------------------------------------------------------------------ */

/* torch.tensor(1.5) */
Test(print, scalar_f32) {
    float v = 1.5f;
    expect_text(make(&v, EM_F32, 0, NULL), "tensor(1.5000)");
}

/* torch.tensor(-7, dtype=torch.int32) */
Test(print, scalar_i32) {
    int32_t v = -7;
    expect_text(make(&v, EM_I32, 0, NULL), "tensor(-7, dtype=int32)");
}

/* torch.tensor([1, -20, 300], dtype=torch.int32) */
Test(print, ints_right_aligned) {
    int32_t v[] = {1, -20, 300};
    expect_text(make(v, EM_I32, 1, SHAPE(3)), "tensor([  1, -20, 300], dtype=int32, shape=[3])");
}

/* torch.tensor([2**62 + 1, -5, 9007199254740993]): exact beyond 2^53 */
Test(print, int64_exact_and_suffix_wrap) {
    int64_t v[] = {((int64_t)1 << 62) + 1, -5, INT64_C(9007199254740993)};
    expect_text(make(v, EM_I64, 1, SHAPE(3)),
        "tensor([4611686018427387905,                  -5,    9007199254740993],\n"
        "       dtype=int64, shape=[3])");
}

/* torch.tensor([0, 7, 255], dtype=torch.uint8) */
Test(print, uint8) {
    uint8_t v[] = {0, 7, 255};
    expect_text(make(v, EM_U8, 1, SHAPE(3)), "tensor([  0,   7, 255], dtype=uint8, shape=[3])");
}

/* torch.tensor([0.1, -2.0, 3.5, 4.25]) */
Test(print, floats_with_decimals) {
    float v[] = {0.1f, -2.0f, 3.5f, 4.25f};
    expect_text(make(v, EM_F32, 1, SHAPE(4)),
                "tensor([ 0.1000, -2.0000,  3.5000,  4.2500], shape=[4])");
}

/* torch.tensor([1., -2., 30.]) */
Test(print, integer_valued_floats) {
    float v[] = {1.f, -2.f, 30.f};
    expect_text(make(v, EM_F32, 1, SHAPE(3)), "tensor([ 1., -2., 30.], shape=[3])");
}

/* torch.tensor([0., 0.]) */
Test(print, all_zeros) {
    float v[] = {0.f, 0.f};
    expect_text(make(v, EM_F32, 1, SHAPE(2)), "tensor([0., 0.], shape=[2])");
}

/* torch.tensor([1e5, 1.0, 0.5]): max/min > 1000 */
Test(print, scientific_large_ratio) {
    float v[] = {1e5f, 1.0f, 0.5f};
    expect_text(make(v, EM_F32, 1, SHAPE(3)),
                "tensor([1.0000e+05, 1.0000e+00, 5.0000e-01], shape=[3])");
}

/* torch.tensor([1e-5, 0.5, -0.25]): min < 1e-4 */
Test(print, scientific_small) {
    float v[] = {1e-5f, 0.5f, -0.25f};
    expect_text(make(v, EM_F32, 1, SHAPE(3)),
                "tensor([ 1.0000e-05,  5.0000e-01, -2.5000e-01], shape=[3])");
}

/* torch.tensor([1., 1e9, -3.]): integer values, max > 1e8 */
Test(print, scientific_integers) {
    float v[] = {1.f, 1e9f, -3.f};
    expect_text(make(v, EM_F32, 1, SHAPE(3)),
                "tensor([ 1.0000e+00,  1.0000e+09, -3.0000e+00], shape=[3])");
}

/* torch.tensor([-1.5, -0.25, -100.125]) */
Test(print, negative) {
    float v[] = {-1.5f, -0.25f, -100.125f};
    expect_text(make(v, EM_F32, 1, SHAPE(3)),
                "tensor([  -1.5000,   -0.2500, -100.1250], shape=[3])");
}

/* torch.tensor([1.5, nan, inf, -inf, 0.]) */
Test(print, nan_inf_mix) {
    float v[] = {1.5f, NAN, INFINITY, -INFINITY, 0.f};
    expect_text(make(v, EM_F32, 1, SHAPE(5)),
                "tensor([1.5000,    nan,    inf,   -inf, 0.0000], shape=[5])");
}

/* torch.tensor([2., nan, -inf]): integer mode ignores non-finite values */
Test(print, nan_inf_integer_mode) {
    float v[] = {2.f, -NAN, -INFINITY}; /* a NaN with the sign bit set still prints "nan" */
    expect_text(make(v, EM_F32, 1, SHAPE(3)), "tensor([2., nan, -inf], shape=[3])");
}

/* torch.tensor([nan, 0., inf]): no nonzero finite value */
Test(print, only_nonfinite_and_zero) {
    float v[] = {NAN, 0.f, INFINITY};
    expect_text(make(v, EM_F32, 1, SHAPE(3)), "tensor([nan, 0., inf], shape=[3])");
}

/* torch.tensor([True, False, True]) */
Test(print, bool_values) {
    bool v[] = {true, false, true};
    expect_text(make(v, EM_BOOL, 1, SHAPE(3)),
                "tensor([ True, False,  True], dtype=bool, shape=[3])");
}

/* torch.tensor([1.25, 2.5], dtype=torch.float64) */
Test(print, float64_suffix) {
    double v[] = {1.25, 2.5};
    expect_text(make(v, EM_F64, 1, SHAPE(2)), "tensor([1.2500, 2.5000], dtype=float64, shape=[2])");
}

/* torch.tensor([0.1, 2.], dtype=torch.float16) */
Test(print, float16) {
    uint16_t v[] = {em_f32_to_f16(0.1f), em_f32_to_f16(2.f)};
    expect_text(make(v, EM_F16, 1, SHAPE(2)), "tensor([0.1000, 2.0000], dtype=float16, shape=[2])");
}

/* torch.zeros(0, 3) */
Test(print, zero_size_2d) {
    expect_text(em_zeros(2, SHAPE(0, 3), EM_F32, em_cpu()), "tensor([], shape=[0, 3])");
}

/* torch.zeros(0, dtype=torch.int64) */
Test(print, zero_size_1d_int64) {
    expect_text(em_zeros(1, SHAPE(0), EM_I64, em_cpu()), "tensor([], dtype=int64, shape=[0])");
}

/* ---- matrices and higher dims ------------------------------------------------------------- */

/* torch.tensor([[0.1, -2.], [3.5, 4.]]) */
Test(print, matrix) {
    float v[] = {0.1f, -2.f, 3.5f, 4.f};
    expect_text(make(v, EM_F32, 2, SHAPE(2, 2)),
        "tensor([[ 0.1000, -2.0000],\n"
        "        [ 3.5000,  4.0000]], shape=[2, 2])");
}

/* torch.arange(24.).reshape(2, 3, 4) * 0.5 - 3 */
Test(print, three_dims) {
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)i * 0.5f - 3.f;
    expect_text(make(v, EM_F32, 3, SHAPE(2, 3, 4)),
        "tensor([[[-3.0000, -2.5000, -2.0000, -1.5000],\n"
        "         [-1.0000, -0.5000,  0.0000,  0.5000],\n"
        "         [ 1.0000,  1.5000,  2.0000,  2.5000]],\n"
        "\n"
        "        [[ 3.0000,  3.5000,  4.0000,  4.5000],\n"
        "         [ 5.0000,  5.5000,  6.0000,  6.5000],\n"
        "         [ 7.0000,  7.5000,  8.0000,  8.5000]]], shape=[2, 3, 4])");
}

/* torch.arange(8.).reshape(2, 1, 2, 2) */
Test(print, four_dims) {
    float v[8];
    for (int i = 0; i < 8; i++)
        v[i] = (float)i;
    expect_text(make(v, EM_F32, 4, SHAPE(2, 1, 2, 2)),
        "tensor([[[[0., 1.],\n"
        "          [2., 3.]]],\n"
        "\n"
        "\n"
        "        [[[4., 5.],\n"
        "          [6., 7.]]]], shape=[2, 1, 2, 2])");
}

/* torch.arange(6.).reshape(2, 3).t(): a non-contiguous view */
Test(print, transposed_view) {
    float v[6] = {0, 1, 2, 3, 4, 5};
    em_tensor *a = make(v, EM_F32, 2, SHAPE(2, 3));
    em_tensor *t = em_transpose(a, 0, 1);
    em_tensor_release(a);
    cr_assert_not_null(t, "%s", em_last_error());
    cr_assert_not(em_tensor_is_contiguous(t));
    expect_text(t,
        "tensor([[0., 3.],\n"
        "        [1., 4.],\n"
        "        [2., 5.]], shape=[3, 2])");
}

/* ---- summarisation ------------------------------------------------------------------------ */

/* torch.arange(2000.) * 0.25 - 10 */
Test(print, summarised_1d) {
    static float v[2000];
    for (int i = 0; i < 2000; i++)
        v[i] = (float)i * 0.25f - 10.f;
    expect_text(make(v, EM_F32, 1, SHAPE(2000)),
        "tensor([-10.0000,  -9.7500,  -9.5000,  ..., 489.2500, 489.5000, 489.7500],\n"
        "       shape=[2000])");
}

/* torch.cat([torch.tensor([1.5, 2., 3.]), torch.full((1994,), 1e10),
 *            torch.tensor([4., 5., 6.])]): hidden values do not change the format */
Test(print, summarised_format_from_shown_values_only) {
    static float v[2000];
    for (int i = 0; i < 2000; i++)
        v[i] = 1e10f;
    float ends[6] = {1.5f, 2.f, 3.f, 4.f, 5.f, 6.f};
    memcpy(v, ends, 3 * sizeof(float));
    memcpy(v + 1997, ends + 3, 3 * sizeof(float));
    expect_text(make(v, EM_F32, 1, SHAPE(2000)),
        "tensor([1.5000, 2.0000, 3.0000,  ..., 4.0000, 5.0000, 6.0000], shape=[2000])");
}

/* torch.arange(10000.).reshape(100, 100) * 0.5 - 2500 */
Test(print, summarised_2d) {
    static float v[10000];
    for (int i = 0; i < 10000; i++)
        v[i] = (float)i * 0.5f - 2500.f;
    expect_text(make(v, EM_F32, 2, SHAPE(100, 100)),
        "tensor([[-2500.0000, -2499.5000, -2499.0000,  ..., -2451.5000, -2451.0000,\n"
        "         -2450.5000],\n"
        "        [-2450.0000, -2449.5000, -2449.0000,  ..., -2401.5000, -2401.0000,\n"
        "         -2400.5000],\n"
        "        [-2400.0000, -2399.5000, -2399.0000,  ..., -2351.5000, -2351.0000,\n"
        "         -2350.5000],\n"
        "        ...,\n"
        "        [ 2350.0000,  2350.5000,  2351.0000,  ...,  2398.5000,  2399.0000,\n"
        "          2399.5000],\n"
        "        [ 2400.0000,  2400.5000,  2401.0000,  ...,  2448.5000,  2449.0000,\n"
        "          2449.5000],\n"
        "        [ 2450.0000,  2450.5000,  2451.0000,  ...,  2498.5000,  2499.0000,\n"
        "          2499.5000]], shape=[100, 100])");
}

/* torch.arange(2000, dtype=torch.int32).reshape(20, 10, 10) */
Test(print, summarised_3d_int32) {
    static int32_t v[2000];
    for (int i = 0; i < 2000; i++)
        v[i] = i;
    expect_text(make(v, EM_I32, 3, SHAPE(20, 10, 10)),
        "tensor([[[   0,    1,    2,  ...,    7,    8,    9],\n"
        "         [  10,   11,   12,  ...,   17,   18,   19],\n"
        "         [  20,   21,   22,  ...,   27,   28,   29],\n"
        "         ...,\n"
        "         [  70,   71,   72,  ...,   77,   78,   79],\n"
        "         [  80,   81,   82,  ...,   87,   88,   89],\n"
        "         [  90,   91,   92,  ...,   97,   98,   99]],\n"
        "\n"
        "        [[ 100,  101,  102,  ...,  107,  108,  109],\n"
        "         [ 110,  111,  112,  ...,  117,  118,  119],\n"
        "         [ 120,  121,  122,  ...,  127,  128,  129],\n"
        "         ...,\n"
        "         [ 170,  171,  172,  ...,  177,  178,  179],\n"
        "         [ 180,  181,  182,  ...,  187,  188,  189],\n"
        "         [ 190,  191,  192,  ...,  197,  198,  199]],\n"
        "\n"
        "        [[ 200,  201,  202,  ...,  207,  208,  209],\n"
        "         [ 210,  211,  212,  ...,  217,  218,  219],\n"
        "         [ 220,  221,  222,  ...,  227,  228,  229],\n"
        "         ...,\n"
        "         [ 270,  271,  272,  ...,  277,  278,  279],\n"
        "         [ 280,  281,  282,  ...,  287,  288,  289],\n"
        "         [ 290,  291,  292,  ...,  297,  298,  299]],\n"
        "\n"
        "        ...,\n"
        "\n"
        "        [[1700, 1701, 1702,  ..., 1707, 1708, 1709],\n"
        "         [1710, 1711, 1712,  ..., 1717, 1718, 1719],\n"
        "         [1720, 1721, 1722,  ..., 1727, 1728, 1729],\n"
        "         ...,\n"
        "         [1770, 1771, 1772,  ..., 1777, 1778, 1779],\n"
        "         [1780, 1781, 1782,  ..., 1787, 1788, 1789],\n"
        "         [1790, 1791, 1792,  ..., 1797, 1798, 1799]],\n"
        "\n"
        "        [[1800, 1801, 1802,  ..., 1807, 1808, 1809],\n"
        "         [1810, 1811, 1812,  ..., 1817, 1818, 1819],\n"
        "         [1820, 1821, 1822,  ..., 1827, 1828, 1829],\n"
        "         ...,\n"
        "         [1870, 1871, 1872,  ..., 1877, 1878, 1879],\n"
        "         [1880, 1881, 1882,  ..., 1887, 1888, 1889],\n"
        "         [1890, 1891, 1892,  ..., 1897, 1898, 1899]],\n"
        "\n"
        "        [[1900, 1901, 1902,  ..., 1907, 1908, 1909],\n"
        "         [1910, 1911, 1912,  ..., 1917, 1918, 1919],\n"
        "         [1920, 1921, 1922,  ..., 1927, 1928, 1929],\n"
        "         ...,\n"
        "         [1970, 1971, 1972,  ..., 1977, 1978, 1979],\n"
        "         [1980, 1981, 1982,  ..., 1987, 1988, 1989],\n"
        "         [1990, 1991, 1992,  ..., 1997, 1998, 1999]]], dtype=int32,\n"
        "       shape=[20, 10, 10])");
}

/* ---- line wrapping ------------------------------------------------------------------------ */

/* torch.arange(30.) / 4 */
Test(print, wrap_1d) {
    float v[30];
    for (int i = 0; i < 30; i++)
        v[i] = (float)i / 4.f;
    expect_text(make(v, EM_F32, 1, SHAPE(30)),
        "tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000, 1.2500, 1.5000, 1.7500, 2.0000,\n"
        "        2.2500, 2.5000, 2.7500, 3.0000, 3.2500, 3.5000, 3.7500, 4.0000, 4.2500,\n"
        "        4.5000, 4.7500, 5.0000, 5.2500, 5.5000, 5.7500, 6.0000, 6.2500, 6.5000,\n"
        "        6.7500, 7.0000, 7.2500], shape=[30])");
}

/* torch.arange(40.).reshape(2, 20) + 0.5 */
Test(print, wrap_2d_rows) {
    float v[40];
    for (int i = 0; i < 40; i++)
        v[i] = (float)i + 0.5f;
    expect_text(make(v, EM_F32, 2, SHAPE(2, 20)),
        "tensor([[ 0.5000,  1.5000,  2.5000,  3.5000,  4.5000,  5.5000,  6.5000,  7.5000,\n"
        "          8.5000,  9.5000, 10.5000, 11.5000, 12.5000, 13.5000, 14.5000, 15.5000,\n"
        "         16.5000, 17.5000, 18.5000, 19.5000],\n"
        "        [20.5000, 21.5000, 22.5000, 23.5000, 24.5000, 25.5000, 26.5000, 27.5000,\n"
        "         28.5000, 29.5000, 30.5000, 31.5000, 32.5000, 33.5000, 34.5000, 35.5000,\n"
        "         36.5000, 37.5000, 38.5000, 39.5000]], shape=[2, 20])");
}

/* torch.arange(12.).reshape(1, 12) * 1.25 - 3 */
Test(print, wrap_one_row_matrix) {
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i * 1.25f - 3.f;
    expect_text(make(v, EM_F32, 2, SHAPE(1, 12)),
        "tensor([[-3.0000, -1.7500, -0.5000,  0.7500,  2.0000,  3.2500,  4.5000,  5.7500,\n"
        "          7.0000,  8.2500,  9.5000, 10.7500]], shape=[1, 12])");
}

/* ---- print options ------------------------------------------------------------------------ */

Test(print, options_defaults_and_restore) {
    em_print_options o = em_print_options_get();
    cr_assert_eq(o.precision, 4);
    cr_assert_eq(o.threshold, 1000);
    cr_assert_eq(o.edgeitems, 3);
    cr_assert_eq(o.linewidth, 80);
    em_print_options_set(&(em_print_options){.precision = 2, .threshold = 10, .edgeitems = 1,
                                             .linewidth = 40});
    o = em_print_options_get();
    cr_assert(o.precision == 2 && o.threshold == 10 && o.edgeitems == 1 && o.linewidth == 40);
    em_print_options_set(NULL);
    o = em_print_options_get();
    cr_assert(o.precision == 4 && o.threshold == 1000 && o.edgeitems == 3 && o.linewidth == 80);
}

static void set_opts(int precision, int64_t threshold, int edgeitems, int linewidth) {
    em_print_options_set(&(em_print_options){.precision = precision, .threshold = threshold,
                                             .edgeitems = edgeitems, .linewidth = linewidth});
}

/* torch.set_printoptions(precision=2); torch.tensor([1.12345, -2.5, 1000.]) */
Test(print, precision_2) {
    set_opts(2, 1000, 3, 80);
    float v[] = {1.12345f, -2.5f, 1000.f};
    expect_text(make(v, EM_F32, 1, SHAPE(3)), "tensor([   1.12,   -2.50, 1000.00], shape=[3])");
}

/* torch.set_printoptions(precision=6); torch.tensor([1/3, 2.]) */
Test(print, precision_6) {
    set_opts(6, 1000, 3, 80);
    float v[] = {(float)(1.0 / 3.0), 2.f};
    expect_text(make(v, EM_F32, 1, SHAPE(2)), "tensor([0.333333, 2.000000], shape=[2])");
}

/* torch.set_printoptions(precision=0); torch.tensor([0.5, 1.5, 2.5, 0.25]): ties to even */
Test(print, precision_0) {
    set_opts(0, 1000, 3, 80);
    float v[] = {0.5f, 1.5f, 2.5f, 0.25f};
    expect_text(make(v, EM_F32, 1, SHAPE(4)), "tensor([0, 2, 2, 0], shape=[4])");
}

/* torch.set_printoptions(linewidth=40); torch.arange(12.) / 8 */
Test(print, linewidth_40) {
    set_opts(4, 1000, 3, 40);
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i / 8.f;
    expect_text(make(v, EM_F32, 1, SHAPE(12)),
        "tensor([0.0000, 0.1250, 0.2500, 0.3750,\n"
        "        0.5000, 0.6250, 0.7500, 0.8750,\n"
        "        1.0000, 1.1250, 1.2500, 1.3750],\n"
        "       shape=[12])");
}

/* torch.set_printoptions(threshold=10, edgeitems=2); torch.arange(20).reshape(4, 5) */
Test(print, threshold_and_edgeitems) {
    set_opts(4, 10, 2, 80);
    int64_t v[20];
    for (int i = 0; i < 20; i++)
        v[i] = i;
    expect_text(make(v, EM_I64, 2, SHAPE(4, 5)),
        "tensor([[ 0,  1,  ...,  3,  4],\n"
        "        [ 5,  6,  ...,  8,  9],\n"
        "        [10, 11,  ..., 13, 14],\n"
        "        [15, 16,  ..., 18, 19]], dtype=int64, shape=[4, 5])");
}

/* torch.set_printoptions(threshold=10, edgeitems=2); torch.arange(11.) */
Test(print, threshold_1d) {
    set_opts(4, 10, 2, 80);
    float v[11];
    for (int i = 0; i < 11; i++)
        v[i] = (float)i;
    expect_text(make(v, EM_F32, 1, SHAPE(11)), "tensor([ 0.,  1.,  ...,  9., 10.], shape=[11])");
}

/* ---- devices ------------------------------------------------------------------------------ */

/* A suite with the test plugin "testdev" (tests/plugins/testdev.c, device memory that the
 * core can reach only through the device's copy) loaded before em_init(). */
static void testdev_setup(void) {
    const char *dir = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert_not_null(dir, "EMBER_TEST_PLUGIN_DIR is not set (make check sets it)");
    char path[4096];
    snprintf(path, sizeof path, "%s/testdev.so", dir);
    cr_assert_eq(em_plugin_load(path), EM_OK, "%s", em_last_error());
    setup();
}

/* torch.tensor([[1.5, -2.], [0.25, 8.]]) on a second device: the device suffix comes after
 * the dtype and before the shape. The values travel through em_tensor_to_host. */
Test(print_device, device_suffix, .init = testdev_setup, .fini = teardown) {
    em_device dev;
    cr_assert_eq(em_device_parse("testdev:1", &dev), EM_OK, "%s", em_last_error());
    float v[] = {1.5f, -2.f, 0.25f, 8.f};
    em_tensor *t = em_from_data(v, 2, SHAPE(2, 2), EM_F32, dev);
    cr_assert_not_null(t, "%s", em_last_error());
    expect_text(t,
        "tensor([[ 1.5000, -2.0000],\n"
        "        [ 0.2500,  8.0000]], device=testdev:1, shape=[2, 2])");
    double w[] = {3., 4.};
    t = em_from_data(w, 1, SHAPE(2), EM_F64, dev);
    cr_assert_not_null(t, "%s", em_last_error());
    expect_text(t, "tensor([3., 4.], dtype=float64, device=testdev:1, shape=[2])");
}

/* ---- the buffer API and errors ------------------------------------------------------------ */

Test(print, format_truncates_like_snprintf) {
    float v[] = {0.1f, -2.0f, 3.5f, 4.25f};
    em_tensor *t = make(v, EM_F32, 1, SHAPE(4));
    const char *full = "tensor([ 0.1000, -2.0000,  3.5000,  4.2500], shape=[4])";
    char buf[11];
    memset(buf, 'x', sizeof buf);
    cr_assert_eq(em_tensor_format(t, buf, sizeof buf), strlen(full));
    cr_assert_str_eq(buf, "tensor([ 0");
    cr_assert_eq(em_tensor_format(t, buf, 1), strlen(full));
    cr_assert_str_eq(buf, "");
    em_tensor_release(t);
}

Test(print, null_tensor_is_an_error) {
    em_clear_error();
    char buf[16] = "junk";
    cr_assert_eq(em_tensor_format(NULL, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "");
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "tensor_format"), "%s", em_last_error());
    em_clear_error();
    cr_assert_eq(em_tensor_print(stdout, NULL), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "tensor_print"), "%s", em_last_error());
}

Test(print, null_stream_is_an_error) {
    float v = 1.f;
    em_tensor *t = make(&v, EM_F32, 0, NULL);
    cr_assert_eq(em_tensor_print(NULL, t), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "stream"), "%s", em_last_error());
    em_tensor_release(t);
}

Test(print, write_failure_is_io_error) {
    float v = 1.f;
    em_tensor *t = make(&v, EM_F32, 0, NULL);
    FILE *f = fopen("/dev/null", "r"); /* writing to a read-only stream fails at once */
    cr_assert_not_null(f);
    cr_assert_eq(em_tensor_print(f, t), EM_ERR_IO);
    cr_assert_not_null(strstr(em_last_error(), "tensor_print"), "%s", em_last_error());
    fclose(f);
    em_tensor_release(t);
}

/* ---- out of memory ------------------------------------------------------------------------ */

/* A host allocator that fails call number fail_at (counted from arming), installed before
 * em_init() as ember/device.h asks. */
static struct {
    atomic_long calls, live;
    long fail_at;
} g_alloc;

static void *failing_alloc(size_t n, size_t align, void *user) {
    (void)user;
    long call = atomic_fetch_add(&g_alloc.calls, 1) + 1;
    if (g_alloc.fail_at && call == g_alloc.fail_at)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : 1) != 0)
        return NULL;
    atomic_fetch_add(&g_alloc.live, 1);
    return p;
}

static void failing_free(void *p, void *user) {
    (void)user;
    if (p) {
        atomic_fetch_sub(&g_alloc.live, 1);
        free(p);
    }
}

static void arm(long fail_at) {
    atomic_store(&g_alloc.calls, 0);
    g_alloc.fail_at = fail_at;
}

static void oom_setup(void) {
    atomic_store(&g_alloc.live, 0);
    arm(0);
    em_host_allocator_set(&(em_host_allocator){failing_alloc, failing_free, NULL});
    setup();
}

static void oom_teardown(void) {
    teardown();
    em_host_allocator_set(NULL);
}

/* torch.arange(24.).reshape(2, 3, 4) * 0.5 - 3 (as in three_dims): the text outgrows the
 * first buffer, so the host copy and two text buffers can each fail. */
Test(print_oom, failure_is_clean_at_every_allocation, .init = oom_setup, .fini = oom_teardown) {
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)i * 0.5f - 3.f;
    em_tensor *t = make(v, EM_F32, 3, SHAPE(2, 3, 4));
    char want[512], got[512];
    size_t want_len = em_tensor_format(t, want, sizeof want);
    cr_assert_gt(want_len, 256);
    long baseline = atomic_load(&g_alloc.live), fails = 0;
    for (long n = 1; n < 100; n++) {
        arm(n);
        size_t len = em_tensor_format(t, got, sizeof got);
        arm(0);
        cr_assert_eq(atomic_load(&g_alloc.live), baseline, "fail_at=%ld: leaked", n);
        if (len == want_len) {
            cr_assert_str_eq(got, want);
            break;
        }
        cr_assert_eq(len, 0, "fail_at=%ld", n);
        cr_assert_str_eq(got, "");
        cr_assert_eq(em_last_status(), EM_ERR_NOMEM, "fail_at=%ld: %s", n, em_last_error());
        cr_assert_not_null(strstr(em_last_error(), "out of memory"), "%s", em_last_error());
        fails++;
    }
    cr_assert_geq(fails, 3, "host copy and both text buffers were made to fail");
    em_tensor_release(t);
}
