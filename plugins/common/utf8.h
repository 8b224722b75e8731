/*
 * utf8.h — decoding one UTF-8 character, shared by the text dataset (plugins/data/text.c) and
 * ember-train's --generate (trainer/generate.c), which must read the same characters the same
 * way: a vocabulary saved by one is read back by the other.
 */
#ifndef EMBER_UTF8_H
#define EMBER_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Decode one UTF-8 character of p[0..n) (n >= 1) into *cp; its length, or 0 when malformed
 * (a truncated or invalid sequence, overlong forms, surrogates and code points past U+10FFFF
 * included). */
static inline size_t em_utf8_decode(const unsigned char *p, size_t n, uint32_t *cp) {
    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    }
    size_t len = (p[0] & 0xE0) == 0xC0 ? 2 : (p[0] & 0xF0) == 0xE0 ? 3 : (p[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || len > n) return 0;
    uint32_t c = p[0] & (0x7F >> len);
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (p[k] & 0x3F);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < least[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

#endif /* EMBER_UTF8_H */
