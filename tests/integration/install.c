// SPDX-License-Identifier: MIT
/*
 * install.c - `make install` on a machine with only `make deps-run`'s
 * packages (issue #38): a copy of the source tree as a fresh clone has it
 * (git's files, no build folder) builds and installs with the test-only
 * libraries hidden: cmocka, hiredis and OpenSSL's headers are replaced by
 * ones that stop the compiler and their libraries by ones that stop the
 * linker, python3-dev's headers and nvcc are left out. The build folder
 * then holds no test and no kvbench; building a test or kvbench's Redis or
 * MAC mode in that copy fails on the hidden library, which shows the
 * hiding works.
 *
 * Runs in the plain build only (a sanitizer build would build the same
 * tree again); skips, saying why, where git or make is missing or this is
 * not a git checkout.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"

/* sh -c cmd, stdout and stderr into out; the exit status. */
static int sh(const char *cmd, char *out, size_t len)
{
	size_t got = 0;
	ssize_t r;
	int p[2], st;
	pid_t pid;

	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		/* Whatever the caller's make said, this make starts afresh. */
		unsetenv("MAKEFLAGS");
		unsetenv("MFLAGS");
		unsetenv("MAKELEVEL");
		unsetenv("MAKEOVERRIDES");
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	while ((r = read(p[0], out + got, len - got - 1)) > 0) {
		got += (size_t)r;
		if (got + 1 >= len) {	/* keep the tail: the error is last */
			memmove(out + 4, out + len / 2, got - len / 2);
			memcpy(out, "...\n", 4);
			got = got - len / 2 + 4;
		}
	}
	out[got] = 0;
	close(p[0]);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void spew(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
}

/* A header that stops the compiler and a library that stops the linker. */
static void hide(const char *top, const char *header, const char *lib)
{
	char path[512], text[256];

	if (header) {
		snprintf(path, sizeof(path), "mkdir -p \"$(dirname %s/include/%s)\"", top, header);
		assert_int_equal(system(path), 0);
		snprintf(path, sizeof(path), "%s/include/%s", top, header);
		snprintf(text, sizeof(text), "#error \"%s: a test-only library (hidden)\"\n", header);
		spew(path, text);
	}
	if (lib) {
		snprintf(path, sizeof(path), "%s/lib/lib%s.so", top, lib);
		snprintf(text, sizeof(text), "INPUT(-lkvt-hidden-test-only-%s)\n", lib);
		spew(path, text);
	}
}

/* Paths are relative to the repository root: make sure we stand in it. */
static void assert_repo_root(void)
{
	if (access("Makefile", R_OK) || access("tools/install-deps", R_OK)) {
		print_message("run from the repository root (tests/run-tests does)\n");
		fail();
	}
}

static bool exists(const char *dir, const char *rel)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	return access(path, F_OK) == 0;
}

static void test_install_with_run_packages_only(void **state)
{
	char top[] = "/tmp/kvt-fresh.XXXXXX", src[64], hid[64], root[64], cmd[2048];
	static char out[1 << 16];
	static const char *const installed[] = {
		"usr/bin/kvcached", "usr/bin/kvstat", "usr/bin/kvdemo",
		"usr/lib/libkvclient.so.0", "usr/lib/libkvclient.a", "usr/include/kvclient.h",
		"usr/lib/systemd/system/kvcached.service", "usr/share/man/man8/kvcached.8",
		"usr/lib/python3/dist-packages/kvclient/__init__.py",
	};
	/* What each hidden library would have been needed for. */
	static const struct {
		const char *target, *lib;
	} refused[] = {
		{ "build/tests/unit/key", "cmocka.h" },
		{ "build/tools/bench/lookup.o", "hiredis/hiredis.h" },
		{ "build/tools/bench/remote.o", "openssl/" },
	};
	size_t i;
	int rc;

	(void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	print_message("skip: the plain build's run builds the same tree\n");
	skip();
#endif
	assert_repo_root();
	if (sh("command -v git && command -v make && git rev-parse --git-dir", out, sizeof(out))) {
		print_message("skip: needs git, make and a git checkout: %s\n", out);
		skip();
	}
	assert_non_null(mkdtemp(top));
	snprintf(src, sizeof(src), "%s/src", top);
	snprintf(hid, sizeof(hid), "%s/hide", top);
	snprintf(root, sizeof(root), "%s/root", top);
	/* The files a clone has (tracked, and new ones not ignored: this
	 * working tree's), no build folder. */
	snprintf(cmd, sizeof(cmd), "mkdir -p %s %s/include %s/lib && git ls-files -z -co "
		 "--exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | "
		 "tar -xf - -C %s", src, hid, hid, src);
	rc = sh(cmd, out, sizeof(out));
	if (rc)
		fail_msg("copying the tree: %s\n%s", cmd, out);
	assert_false(exists(src, "build"));
	hide(hid, "cmocka.h", "cmocka");
	hide(hid, "hiredis/hiredis.h", "hiredis");
	hide(hid, "openssl/evp.h", "crypto");
	hide(hid, "openssl/core_names.h", "ssl");
	hide(hid, "openssl/params.h", NULL);
	/* python3-dev (the binding's fast path) and CUDA are optional: off. */
#define MAKE_FLAGS "--no-print-directory -j2 NO_CUDA=1 PY_INC=/nonexistent " \
		   "CFLAGS=-I%s/include LDFLAGS=-L%s/lib"
	snprintf(cmd, sizeof(cmd), "make -C %s " MAKE_FLAGS " install DESTDIR=%s PREFIX=/usr",
		 src, hid, hid, root);
	rc = sh(cmd, out, sizeof(out));
	if (rc)
		fail_msg("%s: exit %d\n%s", cmd, rc, out);
	for (i = 0; i < sizeof(installed) / sizeof(installed[0]); i++)
		if (!exists(root, installed[i]))
			fail_msg("make install did not install %s\n%s", installed[i], out);
	/* It built what it installs, nothing else. */
	if (exists(src, "build/tests") || exists(src, "build/kvbench") ||
	    exists(src, "build/tools/bench") || exists(src, "build/examples"))
		fail_msg("make install built more than it installs:\n%s", out);
	/* The hiding is real: what needs a hidden library fails on it. */
	for (i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		snprintf(cmd, sizeof(cmd), "make -C %s " MAKE_FLAGS " %s", src, hid, hid,
			 refused[i].target);
		rc = sh(cmd, out, sizeof(out));
		if (!rc || !strstr(out, refused[i].lib) || !strstr(out, "test-only"))
			fail_msg("%s: exit %d, want a failure on the hidden %s:\n%s", cmd, rc,
				 refused[i].lib, out);
	}
#undef MAKE_FLAGS
	snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_install_with_run_packages_only),
	};

	return cmocka_run_group_tests_name("integration/install", tests, NULL, NULL);
}
