/* SPDX-License-Identifier: MIT */
/*
 * check.h - the fuzz targets' assertion: a broken promise names its file,
 * line and condition on the sanitizer's report stream (which libFuzzer keeps
 * open when it discards the target's stderr) and traps, which libFuzzer
 * reports as a crash and saves the input of.
 */
#ifndef KVFUZZ_CHECK_H
#define KVFUZZ_CHECK_H

#include <stdio.h>

/* Weak: a build without sanitizers (a coverage report) prints to stderr. */
void __sanitizer_report_error_summary(const char *error_summary) __attribute__((weak));

__attribute__((noreturn, noinline, cold))
static void check_failed(const char *file, int line, const char *what)
{
	char msg[512];

	snprintf(msg, sizeof(msg), "CHECK failed at %s:%d: %s", file, line, what);
	if (__sanitizer_report_error_summary)
		__sanitizer_report_error_summary(msg);
	else
		fprintf(stderr, "%s\n", msg);
	__builtin_trap();
}

#define CHECK(c) do { if (!(c)) check_failed(__FILE__, __LINE__, #c); } while (0)

#endif
