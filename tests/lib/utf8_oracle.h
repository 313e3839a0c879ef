/* SPDX-License-Identifier: MIT */
/*
 * utf8_oracle.h - a UTF-8 validator for tests that check what kvcached
 * prints (/metrics, kvstat --json). Deliberately separate from the
 * product's kvshm_utf8_len: a test that validated output with the code
 * under test would agree with its bugs. Header-only, so both the cmocka
 * tests and the clang-built fuzz targets can use it.
 */
#ifndef KVT_UTF8_ORACLE_H
#define KVT_UTF8_ORACLE_H

#include <stdint.h>

/* Length of the valid UTF-8 sequence at s, or 0 (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF). */
static inline int kvt_utf8_len(const unsigned char *s)
{
	unsigned char c = s[0];
	uint32_t cp;
	int n, i;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, cp = c & 0x07;
	else
		return 0;
	for (i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* Is the NUL-terminated s valid UTF-8? */
static inline int kvt_utf8_valid(const unsigned char *s)
{
	int n;

	for (; *s; s += n)
		if (!(n = kvt_utf8_len(s)))
			return 0;
	return 1;
}

#endif
