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
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../../daemon/config.h"
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_metrics_utf8_process_name_cut),
		cmocka_unit_test(test_metrics_utf8_model_latin1),
		cmocka_unit_test(test_metrics_escapes_unchanged),
		cmocka_unit_test(test_args_config_as_value),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
