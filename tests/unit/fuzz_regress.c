// SPDX-License-Identifier: MIT
/*
 * fuzz_regress.c - regression tests for what the fuzz targets found
 * (tests/fuzz/; their crash inputs are in tests/fuzz/regress/ too).
 *
 * metrics_utf8: /metrics stayed valid UTF-8 only while every client chose
 * a valid UTF-8 model and process name. A process name cut mid-character
 * at 15 bytes (the kernel's comm, and the daemon's copy of HELLO's name,
 * are both cut so) or a Latin-1 model name made shm/stats.c write bytes a
 * Prometheus scraper refuses ("invalid UTF-8 label value"), and the whole
 * page failed for everyone. Such bytes must come out as U+FFFD, the way
 * kvstat --json already writes them; escaping is unchanged.
 *
 * args_config_as_value: kvd_config_args looked for --config before the
 * other flags without skipping their values, so `--socket --config=X`
 * read the file X (and `--socket --config --pool-size 2G` tried to read a
 * file named "--pool-size") instead of taking the value as the socket
 * path, as the second pass does. Found by the config target's round trip.
 *
 * seeds_hello_current: when HELLO grew (the shard, protocol 2) the seed
 * generator kept writing 120-byte protocol-1 HELLOs, so every
 * daemon_frames seed and both utf8 inputs above stopped at HELLO and the
 * fuzzer started from nothing. Every committed daemon_frames input that
 * starts with a HELLO must carry one the daemon accepts.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../daemon/config.h"
#include "../../shm/proto.h"
#include "../../shm/segment.h"
#include "../../shm/stats.h"
#include "../lib/utf8_oracle.h"

/* The /metrics text of a segment whose one client and namespace carry
 * these names. */
static char *metrics_with(const char *model, const char *comm)
{
	struct kvshm_geometry geo = {
		.page_bytes = 4096, .n_pages = 8, .block_tokens = 16,
		.n_buckets = kvshm_buckets_for(8), .max_clients = 2, .max_ns = 2,
		.ledger_slots = 8,
	};
	struct kvshm_header h;
	struct kvshm_snap snap;
	struct kvshm_ns *ns;
	struct kvshm_client_row *row;
	void *seg;
	size_t need;
	char *text;

	assert_int_equal(kvshm_layout(&h, &geo), 0);
	seg = calloc(1, h.segment_bytes);
	assert_non_null(seg);
	kvshm_init(seg, &h);
	ns = &kvshm_ns(seg)[0];
	strncpy(ns->model, model, sizeof(ns->model) - 1);
	ns->block_tokens = 16;
	atomic_store(&ns->used, 1);
	row = &kvshm_clients(seg)[0];
	strncpy(row->comm, comm, sizeof(row->comm) - 1);
	row->ns_id = 0;
	atomic_store(&row->pid, 4242);

	assert_int_equal(kvshm_snap_take(seg, &snap), 0);
	need = kvshm_prometheus(&snap, NULL, 0);
	text = malloc(need + 1);
	assert_non_null(text);
	assert_int_equal(kvshm_prometheus(&snap, text, need + 1), need);
	kvshm_snap_free(&snap);
	free(seg);
	return text;
}

static void test_metrics_utf8_process_name_cut(void **state)
{
	/* "kv推理服务器" cut to 15 bytes ends in the middle of 器. */
	char comm[16];
	char *text;

	(void)state;
	memcpy(comm, "kv\xe6\x8e\xa8\xe7\x90\x86\xe6\x9c\x8d\xe5\x8a\xa1\xe5", 15);
	comm[15] = 0;
	text = metrics_with("llama", comm);
	assert_true(kvt_utf8_valid((const unsigned char *)text));
	assert_non_null(strstr(text, "comm=\"kv\xe6\x8e\xa8\xe7\x90\x86\xe6\x9c\x8d\xe5\x8a\xa1"
				     "\xef\xbf\xbd\""));
	free(text);
}

static void test_metrics_utf8_model_latin1(void **state)
{
	char *text;

	(void)state;
	text = metrics_with("caf\xe9", "server");
	assert_true(kvt_utf8_valid((const unsigned char *)text));
	assert_non_null(strstr(text, "namespace=\"caf\xef\xbf\xbd\""));
	free(text);
}

static void test_metrics_escapes_unchanged(void **state)
{
	char *text;

	(void)state;
	text = metrics_with("a\"b\\c\nd \xc3\xa9", "x");
	assert_non_null(strstr(text, "namespace=\"a\\\"b\\\\c\\nd \xc3\xa9\""));
	free(text);
}

static void test_args_config_as_value(void **state)
{
	char *a1[] = { "kvcached", "--socket", "--config=/nonexistent/kvfuzz", NULL };
	char *a2[] = { "kvcached", "--socket", "--config", "--pool-size", "2G", NULL };
	struct kvd_config cfg;

	(void)state;
	kvd_config_defaults(&cfg);
	assert_int_equal(kvd_config_args(&cfg, 3, a1), 0);
	assert_string_equal(cfg.socket, "--config=/nonexistent/kvfuzz");
	kvd_config_defaults(&cfg);
	assert_int_equal(kvd_config_args(&cfg, 5, a2), 0);
	assert_string_equal(cfg.socket, "--config");
	assert_int_equal(cfg.pool_size, 2ull << 30);
}

/* The first frame of a daemon_frames input (a flag byte, an operation
 * byte, a frame), if it is a HELLO: decodable and accepted. */
static int hello_ok_in(const char *dir, const char *name)
{
	char path[512];
	uint8_t buf[2 + sizeof(struct kvproto_hdr) + sizeof(struct kvproto_hello)];
	struct kvproto_hdr h;
	struct kvproto_hello hi;
	struct kvshm_ns ns;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "rb");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	if (n < 2 + sizeof(h))
		return -1;
	memcpy(&h, buf + 2, sizeof(h));
	if ((buf[1] & 15) > 8 || h.type != KVPROTO_HELLO)
		return -1;	/* not a frame, or not a HELLO first */
	if (n != sizeof(buf) || kvproto_decode(&h, buf + 2 + sizeof(h), 16, NULL))
		return 0;
	memcpy(&hi, buf + 2 + sizeof(h), sizeof(hi));
	return hi.version == KVPROTO_VERSION && !kvproto_hello_ns(&hi, &ns);
}

static void test_seeds_hello_current(void **state)
{
	static const char *const dirs[] = { "tests/fuzz/corpus/daemon_frames",
					    "tests/fuzz/regress/daemon_frames" };
	int hellos = 0;

	(void)state;
	for (size_t k = 0; k < sizeof(dirs) / sizeof(dirs[0]); k++) {
		DIR *d = opendir(dirs[k]);
		struct dirent *e;

		if (!d)
			skip();	/* not run from the source tree */
		while ((e = readdir(d))) {
			int ok;

			if (e->d_name[0] == '.')
				continue;
			ok = hello_ok_in(dirs[k], e->d_name);
			if (!ok)
				fail_msg("%s/%s: its HELLO is not one this daemon accepts (regenerate: python3 tests/fuzz/seeds.py)",
					 dirs[k], e->d_name);
			hellos += ok == 1;
		}
		closedir(d);
	}
	assert_true(hellos >= 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_metrics_utf8_process_name_cut),
		cmocka_unit_test(test_metrics_utf8_model_latin1),
		cmocka_unit_test(test_metrics_escapes_unchanged),
		cmocka_unit_test(test_args_config_as_value),
		cmocka_unit_test(test_seeds_hello_current),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
