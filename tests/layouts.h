/*
 * tests/layouts.h — the same logical (rows, cols) values in four memory layouts, for the
 * elementwise and math op tests (test_ops.c, test_ops_math.c): contiguous, transposed, sliced
 * (every other column) and expanded (stride 0). Include after tests/common.h.
 */
#ifndef EM_TESTS_LAYOUTS_H
#define EM_TESTS_LAYOUTS_H

typedef enum layout { CONTIG, TRANSPOSED, SLICED, EXPANDED, N_LAYOUTS } layout;
static const char *const layout_names[] = {"contiguous", "transposed", "sliced", "expanded"};

/* A (rows, cols) tensor of dtype dt holding L (C order) laid out as `how`: contiguous; the
 * transpose of a (cols, rows) tensor; every other column of a (rows, 2 cols) tensor; or a
 * (1, cols) row expanded with stride 0 (then L's rows must all equal its first row). */
static em_tensor *logical(em_dtype dt, layout how, int64_t rows, int64_t cols, const double *L) {
    int64_t n = rows * cols;
    double *p = malloc(sizeof(double) * (size_t)(2 * n + cols + 1));
    em_tensor *phys = NULL, *t = NULL;
    switch (how) {
    case CONTIG:
        t = em_test_tensor(dt, 2, (const int64_t[]){rows, cols}, L);
        break;
    case TRANSPOSED:
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) p[j * rows + i] = L[i * cols + j];
        phys = em_test_tensor(dt, 2, (const int64_t[]){cols, rows}, p);
        t = em_transpose(phys, 0, 1);
        break;
    case SLICED:
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                p[i * 2 * cols + 2 * j] = L[i * cols + j];
                p[i * 2 * cols + 2 * j + 1] = 99; /* must never be read */
            }
        phys = em_test_tensor(dt, 2, (const int64_t[]){rows, 2 * cols}, p);
        t = em_slice(phys, 1, 0, 2 * cols, 2);
        break;
    case EXPANDED:
        phys = em_test_tensor(dt, 2, (const int64_t[]){1, cols}, L);
        t = em_expand(phys, 2, (const int64_t[]){rows, cols});
        break;
    default:
        cr_assert_fail("bad layout");
    }
    free(p);
    em_tensor_release(phys);
    cr_assert(t, "layout %s: %s", layout_names[how], em_last_error());
    return t;
}

#endif /* EM_TESTS_LAYOUTS_H */
