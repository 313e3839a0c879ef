// SPDX-License-Identifier: MIT
/*
 * examples.c - the programs the docs quote (tools/examples/; the Makefile
 * builds them against libkvclient as a user's program is built) run
 * against the real daemon and do what the docs say: the README's engine
 * finds its prompt cached the second time, INSTALL.md's hello-kvc attaches
 * and prints the library's version. tests/python/test_docs.py checks that
 * the docs quote these files verbatim.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/harness.h"

static void test_engine(void **state)
{
	/* Llama-3-8B's pages: the daemon's default 2 MiB. */
	const char *dargs[] = { "--page-size", "2M", "--pool-size", "64M", NULL };
	struct kvt_daemon d;
	const char *args[] = { d.sock, NULL };
	char out[4096];
	int rc;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, dargs), 0);
	args[0] = d.sock;
	rc = kvt_run(kvt_bin("examples/engine"), args, out, sizeof(out));
	if (rc)
		fail_msg("engine: status %d\n%s", rc, out);
	assert_string_equal(out, "first run: 0 of 6 blocks cached; second run: 6\n");
	/* Run again: it finds what the first process published. */
	rc = kvt_run(kvt_bin("examples/engine"), args, out, sizeof(out));
	assert_int_equal(rc, 0);
	assert_string_equal(out, "first run: 6 of 6 blocks cached; second run: 6\n");
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

static void test_engine_refused(void **state)
{
	/* Pages too small for its model: it says why, exit 1. */
	struct kvt_daemon d;
	const char *args[] = { NULL, NULL };
	char out[4096];

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	args[0] = d.sock;
	assert_int_equal(kvt_run(kvt_bin("examples/engine"), args, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "kvc_open: model geometry does not fit the kvcached pool: geometry: model llama-3-8b@main needs 2097152-byte pages"));
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

static void test_hello(void **state)
{
	const char *dargs[] = { "--page-size", "2M", "--pool-size", "4M", NULL };
	const char *none[] = { NULL };
	struct kvt_daemon d;
	char out[4096], want[128];

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, dargs), 0);
	setenv("KVCACHED_SOCKET", d.sock, 1);
	assert_int_equal(kvt_run(kvt_bin("examples/hello-kvc"), none, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "libkvclient %s (%d): attached\n", KVC_VERSION_STRING,
		 KVC_VERSION_NUMBER);
	assert_string_equal(out, want);
	assert_int_equal(kvt_daemon_stop(&d), 0);
	/* No daemon: it says so, exit 1. */
	assert_int_equal(kvt_run(kvt_bin("examples/hello-kvc"), none, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "no kvcached socket at that path"));
	unsetenv("KVCACHED_SOCKET");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_engine),
		cmocka_unit_test(test_engine_refused),
		cmocka_unit_test(test_hello),
	};

	return cmocka_run_group_tests_name("integration/examples", tests, NULL, NULL);
}
