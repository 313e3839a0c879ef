// SPDX-License-Identifier: MIT
/*
 * python.c - kvbench's python mode: what the Python binding (the kvclient
 * package: ctypes over libkvclient) adds to a request, against the very
 * same calls made from C, in the same run.
 *
 * One request is what an engine pays per prompt for a prefix lookup:
 * kvc_req_new + kvc_lookup + kvc_req_free of a cached prompt of 1 or 256
 * blocks (16 or 4096 tokens); every lookup must hit every block. From C
 * that is the three calls; from Python it is
 *
 *	with client.request(tokens) as r:
 *	    r.lookup()
 *
 * with the tokens in each form an engine may hold them: an
 * array.array('I'), a list of ints (vLLM's prompt_token_ids), numpy
 * arrays of uint32 and of int64 (what numpy.array(list) gives), torch
 * tensors of int32 and of int64 (what torch.tensor(list) gives). With the
 * binding's C fast path (_kvcfast, built by make) a list is converted in
 * one C loop and 32-bit buffers are passed by address; without it, through
 * ctypes. The line after the table says which ran.
 *
 * The Python side is a child interpreter ($KVBENCH_PYTHON, else
 * /usr/bin/python3, else python3 on PATH) running the script below with
 * the package and library next to this kvbench (a build tree:
 * ../libclient/python and ./libkvclient.so) or else the installed ones.
 * kvbench alternates slices: a C slice here, then a Python slice in the
 * child (asked for over a pipe; the child times its own loop), ROUNDS
 * rounds of each per row, medians of the per-slice ns per request.
 *
 * Rows: op "py_request" (array tokens), "py_request_list",
 * "py_request_numpy_u32", "py_request_numpy_i64", "py_request_torch_i32",
 * "py_request_torch_i64" (skipped, saying why, without numpy or torch), in
 * ns per request, the peer "C" being the same requests from C (goal: a
 * ratio of at most 1.5 at 256 blocks); op "py_added": the array figure
 * minus the C figure, against the
 * goal of 2 us (peer "goal 2 us"; a ratio up to 1 meets it). A sanitizer
 * build's library cannot be loaded into a plain interpreter: there, and
 * without python3 or the package, the rows say why they were skipped.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define PY_BATCH 8	/* requests between two clock reads, both sides */

static const size_t py_sizes[] = { 1, 256 };

/* The child: attach, then answer "run BLOCKS FORM NS" lines with
 * "NS_PER_REQUEST REQUESTS" until stdin ends. */
static const char py_script[] =
"import array, sys, time\n"
"import kvclient\n"
"\n"
"def slice_(req, t, nb, ns, clock=time.perf_counter_ns):\n"
"    n = 0\n"
"    t0 = clock()\n"
"    end = t0 + ns\n"
"    while True:\n"
"        for _ in range(8):\n"
"            with req(t) as r:\n"
"                if r.lookup() != nb:\n"
"                    sys.exit(f'lookup of {nb} cached blocks hit {r.hits}')\n"
"        n += 8\n"
"        if clock() >= end:\n"
"            return (clock() - t0) / n, n\n"
"\n"
"def forms(a):\n"
"    f = {'array': a, 'list': a.tolist()}\n"
"    try:\n"
"        import numpy\n"
"        f['numpy-u32'] = numpy.array(a, dtype=numpy.uint32)\n"
"        f['numpy-i64'] = numpy.array(a.tolist())\n"
"    except ImportError:\n"
"        pass\n"
"    try:\n"
"        import torch\n"
"        f['torch-i32'] = torch.tensor(a.tolist(), dtype=torch.int32)\n"
"        f['torch-i64'] = torch.tensor(a.tolist())\n"
"    except ImportError:\n"
"        pass\n"
"    return f\n"
"\n"
"def main(sock, name, *paths):\n"
"    c = kvclient.Client(kvclient.Model(name, 2, 1, 2, 32, 16), socket=sock)\n"
"    toks = {}\n"
"    for path in paths:\n"
"        a = array.array('I')\n"
"        with open(path, 'rb') as f:\n"
"            a.frombytes(f.read())\n"
"        toks[len(a) // 16] = forms(a)\n"
"    fast = 'C fast path' if c._fast else 'ctypes only'\n"
"    print('ready', kvclient.version(), kvclient.library_path(), fast, flush=True)\n"
"    for line in sys.stdin:\n"
"        _, nb, form, ns = line.split()\n"
"        t = toks[int(nb)].get(form)\n"
"        if t is None:\n"
"            print('skip', flush=True)\n"
"            continue\n"
"        print(*slice_(c.request, t, int(nb), int(ns)), flush=True)\n"
"\n"
"main(*sys.argv[1:])\n";

_Static_assert(PY_BATCH == 8, "the script's batch");

struct py_child {
	pid_t pid;
	FILE *in, *out;
	char log[PATH_MAX];
};

/* Why the Python side cannot run here, or NULL. */
static const char *py_unavailable(char *python, size_t len)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	(void)python, (void)len;
	return "sanitizer build: its libkvclient cannot load into a plain python3";
#else
	const char *env = getenv("KVBENCH_PYTHON"), *path = getenv("PATH");
	char dir[PATH_MAX], *save = NULL, *d;

	if (env && *env) {
		snprintf(python, len, "%s", env);
		return access(python, X_OK) ? "$KVBENCH_PYTHON is not executable" : NULL;
	}
	snprintf(python, len, "/usr/bin/python3");
	if (!access(python, X_OK))
		return NULL;
	snprintf(dir, sizeof(dir), "%s", path ? path : "");
	for (d = strtok_r(dir, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		snprintf(python, len, "%s/python3", d);
		if (!access(python, X_OK))
			return NULL;
	}
	return "python3 not found";
#endif
}

/* The environment of the child: the package and library of this build
 * tree when kvbench runs from one, else whatever is installed. */
static void py_env(void)
{
	char exe[PATH_MAX], path[PATH_MAX + 64], pkg[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	const char *old = getenv("PYTHONPATH");
	char *slash;

	setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
	if (n <= 0)
		return;
	exe[n] = 0;
	slash = strrchr(exe, '/');
	if (!slash)
		return;
	*slash = 0;
	snprintf(path, sizeof(path), "%s/libkvclient.so", exe);
	if (!access(path, R_OK) && !getenv("KVCLIENT_LIB"))
		setenv("KVCLIENT_LIB", path, 1);
	snprintf(path, sizeof(path), "%s/../libclient/python/kvclient/__init__.py", exe);
	if (!access(path, R_OK) && realpath(path, pkg)) {
		pkg[strlen(pkg) - strlen("/kvclient/__init__.py")] = 0;
		snprintf(path, sizeof(path), "%s%s%s", pkg, old && *old ? ":" : "",
			 old ? old : "");
		setenv("PYTHONPATH", path, 1);
	}
}

/* Start the child; NULL on success, else why not (its log's last line). */
static const char *py_start(struct py_child *ch, const char *python, const char *sock,
			    const char *name, char files[][PATH_MAX], size_t nfiles, char *why,
			    size_t whylen)
{
	int in[2], out[2], logfd;
	const char *argv[8];
	char line[512];
	size_t k, n = 0;

	snprintf(ch->log, sizeof(ch->log), "%s/python.log", run_dir());
	if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
		die("pipe: %s", strerror(errno));
	argv[n++] = python;
	argv[n++] = "-c";
	argv[n++] = py_script;
	argv[n++] = sock;
	argv[n++] = name;
	for (k = 0; k < nfiles; k++)
		argv[n++] = files[k];
	argv[n] = NULL;
	fflush(stdout);
	fflush(stderr);
	ch->pid = fork();
	if (ch->pid < 0)
		die("fork: %s", strerror(errno));
	if (!ch->pid) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		logfd = open(ch->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(in[0], 0);
		dup2(out[1], 1);
		if (logfd >= 0)
			dup2(logfd, 2);
		py_env();
		execv(python, (char **)argv);
		fprintf(stderr, "exec %s: %s\n", python, strerror(errno));
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	ch->in = fdopen(in[1], "w");
	ch->out = fdopen(out[0], "r");
	if (!ch->in || !ch->out)
		die("fdopen: %s", strerror(errno));
	if (fgets(line, sizeof(line), ch->out) && !strncmp(line, "ready ", 6)) {
		size_t k = strlen(mode_text);

		snprintf(mode_text + k, sizeof(mode_text) - k, "python: the binding ran with %s\n",
			 strstr(line, "C fast path") ? "its C fast path (_kvcfast)"
						     : "ctypes only (no _kvcfast)");
		return NULL;
	}
	/* It did not come up: the last line of what it said is the reason. */
	snprintf(why, whylen, "%.200s could not attach", python);
	{
		FILE *f = fopen(ch->log, "r");
		char l[512];

		while (f && fgets(l, sizeof(l), f))
			if (*l != '\n' && *l != ' ')
				snprintf(why, whylen, "python3: %.*s", (int)strcspn(l, "\n"), l);
		if (f)
			fclose(f);
	}
	return why;
}

static void py_stop(struct py_child *ch)
{
	if (ch->in)
		fclose(ch->in);	/* end of stdin: the child exits */
	if (ch->out)
		fclose(ch->out);
	if (ch->pid > 0)
		waitpid(ch->pid, NULL, 0);
	unlink(ch->log);
	memset(ch, 0, sizeof(*ch));
}

/* One Python slice of about ns nanoseconds: its ns per request; 0 when
 * the child has no such input (numpy or torch not installed). */
static double py_slice(struct py_child *ch, size_t blocks, const char *form, uint64_t ns)
{
	char line[128];
	double per;
	unsigned long long n;

	fprintf(ch->in, "run %zu %s %llu\n", blocks, form, (unsigned long long)ns);
	fflush(ch->in);
	if (!fgets(line, sizeof(line), ch->out))
		die("the Python side of the python mode stopped (its log: %s)", ch->log);
	if (!strncmp(line, "skip", 4))
		return 0;
	if (sscanf(line, "%lf %llu", &per, &n) != 2 || !n)
		die("the Python side of the python mode stopped (its log: %s)", ch->log);
	return per;
}

/* One C slice: the same requests, the same batching. */
static double c_slice(kvc_t *c, const uint32_t *t, size_t blocks, uint64_t ns)
{
	uint64_t t0 = now_ns(), end = t0 + ns, n = 0;
	struct kvc_req *r;
	int k;

	do {
		for (k = 0; k < PY_BATCH; k++) {
			ck(kvc_req_new(c, t, blocks * BT, NULL, 0, &r), "kvc_req_new");
			if ((size_t)ck(kvc_lookup(r), "kvc_lookup") != blocks)
				die("a lookup of %zu cached blocks missed", blocks);
			kvc_req_free(r);
		}
		n += PY_BATCH;
	} while (now_ns() < end);
	return (double)(now_ns() - t0) / (double)n;
}

static void publish_all(kvc_t *c, const uint32_t *t, size_t blocks)
{
	struct kvc_req *r;

	ck(kvc_req_new(c, t, blocks * BT, NULL, 0, &r), "kvc_req_new");
	ck(kvc_lookup(r), "kvc_lookup");
	if (kvc_alloc(r) > 0)
		ck(kvc_publish(r), "kvc_publish");
	kvc_req_free(r);
	ck(kvc_req_new(c, t, blocks * BT, NULL, 0, &r), "kvc_req_new");
	if ((size_t)ck(kvc_lookup(r), "kvc_lookup") != blocks)
		die("a published %zu-block prompt does not hit (pool too small?)", blocks);
	kvc_req_free(r);
}

static void skip_rows(const char *why)
{
	size_t i;

	for (i = 0; i < NELEM(py_sizes); i++) {
		struct row r = { "python", "py_request", 1, py_sizes[i], 4096, NULL, "ns", "C",
				 0, 0, why };

		add_row(&r);
	}
}

void mode_python(void)
{
	static char name[64], files[NELEM(py_sizes)][PATH_MAX];
	char python[PATH_MAX], why[512];
	static const char *const forms[] = { "array", "list", "numpy-u32", "numpy-i64",
					     "torch-i32", "torch-i64" };
	static const char *const ops[] = { "py_request", "py_request_list",
					   "py_request_numpy_u32", "py_request_numpy_i64",
					   "py_request_torch_i32", "py_request_torch_i64" };
	uint32_t *tok[NELEM(py_sizes)];
	struct kvc_model m;
	struct py_child ch = { 0 };
	const char *sock, *no;
	size_t i, f;
	kvc_t *c;
	FILE *fp;

	if ((no = py_unavailable(python, sizeof(python)))) {
		fprintf(stderr, "kvbench: python mode: %s\n", no);
		skip_rows(no);
		return;
	}
	sock = opt.socket ? opt.socket : daemon_start("python", "4K", "64M");
	snprintf(name, sizeof(name), "kvbench-python-%d", (int)getpid());
	m = tiny_model(name);
	c = open_model(sock, &m);
	for (i = 0; i < NELEM(py_sizes); i++) {
		tok[i] = xmalloc(py_sizes[i] * BT * sizeof(uint32_t));
		make_tokens(tok[i], py_sizes[i] * BT, 0x7079000 + i);
		publish_all(c, tok[i], py_sizes[i]);
		snprintf(files[i], sizeof(files[i]), "%s/python-%zu.tokens", run_dir(), py_sizes[i]);
		fp = fopen(files[i], "wb");
		if (!fp || fwrite(tok[i], sizeof(uint32_t), py_sizes[i] * BT, fp) !=
		    py_sizes[i] * BT || fclose(fp))
			die("writing %s: %s", files[i], strerror(errno));
	}
	if ((no = py_start(&ch, python, sock, name, files, NELEM(py_sizes), why, sizeof(why)))) {
		fprintf(stderr, "kvbench: python mode: %s\n", no);
		py_stop(&ch);
		skip_rows(no);
		goto out;
	}
	for (i = 0; i < NELEM(py_sizes); i++) {
		for (f = 0; f < NELEM(forms); f++) {
			uint64_t slice = (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
			double py[ROUNDS], cc[ROUNDS], mp, mc;
			int r;

			/* Warm both sides (first-call costs, caches). */
			c_slice(c, tok[i], py_sizes[i], slice / 4);
			if (!py_slice(&ch, py_sizes[i], forms[f], slice / 4)) {
				add_row(&(struct row){ "python", ops[f], 1, py_sizes[i], 4096,
						       NULL, "ns", "C", 0, 0,
						       "numpy or torch not installed" });
				continue;
			}
			for (r = 0; r < ROUNDS; r++) {
				cc[r] = c_slice(c, tok[i], py_sizes[i], slice);
				py[r] = py_slice(&ch, py_sizes[i], forms[f], slice);
			}
			mp = median(py, ROUNDS);
			mc = median(cc, ROUNDS);
			add_row(&(struct row){ "python", ops[f], 1, py_sizes[i], 4096, NULL, "ns",
					       "C", mp, mc, NULL });
			if (!f)
				add_row(&(struct row){ "python", "py_added", 1, py_sizes[i], 4096,
						       NULL, "ns", "goal 2 us", mp - mc, 2000,
						       NULL });
		}
	}
	py_stop(&ch);
out:
	for (i = 0; i < NELEM(py_sizes); i++) {
		unlink(files[i]);
		free(tok[i]);
	}
	bench_close(c);	/* on a user's daemon: drops what this mode published */
	if (!opt.socket)
		daemon_stop(true);
}
