/*
 * test_cxx.cpp — the public headers compile as C++ (g++ -Wall -Wextra -Werror, through
 * <ember/ember.h>, which includes every public header) and the library works when called from
 * C++: create, add, check against a plain loop, release.
 */
#include <criterion/criterion.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

static void cxx_setup(void) { cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error()); }
static void cxx_teardown(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

TestSuite(cxx, .init = cxx_setup, .fini = cxx_teardown);

Test(cxx, add_from_cplusplus) {
    const int64_t shape[2] = {2, 3};
    std::vector<float> a_vals = {1.5f, -2.0f, 3.25f, 0.0f, 8.0f, -0.5f};
    std::vector<float> b_vals = {0.5f, 4.0f, -1.25f, 2.0f, -8.0f, 10.0f};
    em_tensor *a = em_from_data(a_vals.data(), 2, shape, EM_F32, em_cpu());
    em_tensor *b = em_from_data(b_vals.data(), 2, shape, EM_F32, em_cpu());
    em_tensor *c = em_add(a, b);
    cr_assert(c != nullptr, "add: %s", em_last_error());
    cr_assert_eq(em_tensor_dtype(c), EM_F32);
    cr_assert_eq(em_tensor_ndim(c), 2);
    cr_assert_eq(em_tensor_size(c, 0), 2);
    cr_assert_eq(em_tensor_size(c, 1), 3);

    std::vector<float> got(6);
    cr_assert_eq(em_tensor_to_host(c, got.data(), got.size() * sizeof(float)), EM_OK, "%s",
                 em_last_error());
    for (size_t i = 0; i < got.size(); i++)
        cr_assert_eq(got[i], a_vals[i] + b_vals[i], "element %zu: %g, expected %g", i,
                     (double)got[i], (double)(a_vals[i] + b_vals[i]));
    em_tensor_release(c);
    em_tensor_release(b);
    em_tensor_release(a);
}

/* Errors reach C++ callers the same way: a NULL result and a message naming the shapes. */
Test(cxx, shape_error_from_cplusplus) {
    const int64_t s1[1] = {3}, s2[1] = {4};
    em_tensor *a = em_zeros(1, s1, EM_F32, em_cpu());
    em_tensor *b = em_zeros(1, s2, EM_F32, em_cpu());
    cr_assert(a && b, "%s", em_last_error());
    em_tensor *c = em_add(a, b);
    cr_assert_null(c);
    cr_assert_eq(em_last_status(), EM_ERR_SHAPE, "%s", em_last_error());
    cr_assert(std::strstr(em_last_error(), "[3]") && std::strstr(em_last_error(), "[4]"),
              "message '%s' does not name both shapes", em_last_error());
    em_tensor_release(b);
    em_tensor_release(a);
}

/* The inline Philox reference in ember/random.h compiles as C++ and gives Random123's
 * published known-answer value for counter 0, key 0 (kat_vectors: philox4x32_10). */
Test(cxx, philox_inline_header_code) {
    const uint32_t ctr[4] = {0, 0, 0, 0}, key[2] = {0, 0};
    uint32_t out[4];
    em_philox4x32_10(ctr, key, out);
    const uint32_t want[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(out[i], want[i], "word %d: %08x, expected %08x", i, out[i], want[i]);
}
