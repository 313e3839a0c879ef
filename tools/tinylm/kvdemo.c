// SPDX-License-Identifier: MIT
/*
 * kvdemo - the reference inference process: tinylm (tools/tinylm/) serving
 * seed workloads through kvcached, with time to first token cold and warm,
 * tokens reused and hit ratios; the same requests show in kvstat under
 * their labels. Workloads:
 *
 *   qa      one long table document (--doc-tokens) and different questions
 *   chat    multi-turn chat: each turn's prompt extends the last
 *   multi   --procs processes at once (fork) sharing one document
 *   modules prompt modules from a schema file (--schema), Prompt Cache style
 *   group   a batch run by --procs workers in arrival order, then in the
 *           order kvc_group() gives (each group's first goes first)
 *
 * qa checks its --cold-runs prompts warm against cold, and modules every
 * composition against a cold prefill: kvdemo exits 1 if a cached prefix
 * ever changed a logit. (chat, multi and group only time and count; the
 * exactness of every prefix length, across processes too, is what
 * tests/integration/tinylm.c asserts.)
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../libclient/observe.h"
#include "../../shm/proto.h"
#include "compose.h"
#include "schema.h"
#include "tinylm.h"

/* Most --prompt and --prompt-file options. */
#define MAX_PROMPTS 256

static struct {
	const char *socket, *daemon, *checkpoint, *schema, *pool_size, *user;
	char *modules;
	struct tlm_arg args[16];
	int nargs;
	bool spawn, compare_cold, block_tokens_set, workloads_set;
	uint64_t seed;
	struct tlm_config cfg;
	int doc_tokens, question_tokens, gen, procs, questions, turns, cold_runs;
	int prompt_procs;	/* processes your prompts are spread over */
	int group_docs, group_doc_tokens;
	uint32_t block_tokens;
	char workloads[64];
	/* --prompt TEXT and --prompt-file FILE, in the order given. */
	struct { const char *arg; bool file; } prompts[MAX_PROMPTS];
	int nprompts;
} opt = {
	.seed = TLM_DEMO_SEED,
	.cfg = TLM_DEMO_CONFIG,
	.doc_tokens = 2000, .question_tokens = 32, .gen = 16, .procs = 3, .questions = 4,
	.turns = 4, .cold_runs = 1, .group_docs = 4, .group_doc_tokens = 512, .block_tokens = 16,
	.pool_size = "256M", .workloads = "qa,chat,multi,modules,group",
};

static struct tlm_model model;
static int failures;
/* Set, in memory shared with the workers, when a prefill found the
 * connection to kvcached gone: the run fails, and kvstat has nothing to
 * show. */
static int *cache_lost;

static struct {
	pid_t pid;
	char dir[64], sock[108], log[128];
} dmn;

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvdemo: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (dmn.pid > 0) {
		kill(dmn.pid, SIGTERM);
		waitpid(dmn.pid, NULL, 0);
		unlink(dmn.sock);
		unlink(dmn.log);
		rmdir(dmn.dir);
	}
	exit(2);
}

/* A hit ratio in percent as kvstat shows it: one decimal, truncated, so
 * that 100.0% means nothing was missed and both print the same figure. */
static double pct(uint64_t hit, uint64_t total)
{
	return total ? floor(1000.0 * (double)hit / (double)total + 1e-9) / 10 : 0.0;
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvdemo [--socket PATH | --spawn] [options]\n"
"       kvdemo [--socket PATH | --spawn] --prompt-file FILE [--prompt-file FILE...]\n"
"              [--prompt TEXT...] [--procs N] [--compare-cold] [--max-tokens N]\n"
"\n"
"Runs tinylm, a small transformer, against kvcached and shows what the\n"
"cache saves: time to first token cold and warm, tokens reused, hit ratio.\n"
"Your own prompts go through plain automatic prefix caching (the cached\n"
"prefix of each prompt's tokens is reused); the seed workloads are below.\n"
"tinylm's weights are random unless --checkpoint: answers are not\n"
"meaningful text, the timings and the reuse are real.\n"
"\n"
"  --prompt TEXT        a prompt (repeat for more)\n"
"  --prompt-file FILE   a prompt, the file's bytes exactly (repeat for more);\n"
"                       prompts run in the order given, one at a time\n"
"  --procs N            processes the prompts are spread over, each attached\n"
"                       on its own, prompt i in process i mod N (default 1);\n"
"                       also the processes of multi and group (default 3)\n"
"  --compare-cold       also run each prompt with no cache and check that its\n"
"                       logits are bitwise those of the cached run\n"
"  --max-tokens N, --gen N\n"
"                       tokens generated per answer (default 16)\n"
"  --socket PATH        kvcached's socket (default $KVCACHED_SOCKET, else the\n"
"                       default path)\n"
"  --spawn              start a private kvcached for the run (the one next to\n"
"                       kvdemo, or --daemon PATH), page size fitted to the model\n"
"  --pool-size SIZE     with --spawn (default 256M)\n"
"  --workload LIST      comma-separated, run in the order given: prompts, qa,\n"
"                       chat, multi, modules, group (default: prompts when\n"
"                       given, else qa,chat,multi,modules,group)\n"
"  --seed N             weights seed (default 42)\n"
"  --layers N --dim N --hidden N --heads N --kv-heads N\n"
"                       model size (default 4, 256, 768, 8, 4)\n"
"  --checkpoint FILE    a llama2.c checkpoint instead of generated weights\n"
"  --block-tokens N     must equal the daemon's (default: the daemon's, 16\n"
"                       with --spawn)\n"
"  --doc-tokens N       document length (default 2000)\n"
"  --question-tokens N  question length (default 32)\n"
"  --questions N        questions per document (default 4)\n"
"  --cold-runs N        qa: cold runs, interleaved with the warm ones (default 1)\n"
"  --turns N            chat turns (default 4)\n"
"  --group-docs N       documents in the group batch (default 4; questions:\n"
"                       --questions)\n"
"  --group-doc-tokens N their length (default 512)\n"
"  --schema FILE        prompt-module schema (default: a built-in one); then:\n"
"  --modules A,B,...    the modules a prompt names (default: the first of\n"
"                       each union and every other module)\n"
"  --arg NAME=VALUE     a param's value (repeat for more)\n"
"  --user TEXT          the user text after the modules\n"
"  --help, --version\n");
}

static bool want(const char *w);

static long parse_num(const char *name, const char *v, long min, long max)
{
	char *end;
	long x;

	errno = 0;
	x = strtol(v, &end, 10);
	if (errno || end == v || *end || x < min || x > max)
		die("--%s %s: expected a whole number from %ld to %ld", name, v, min, max);
	return x;
}

static void parse_args(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", 1, 0, 'S' }, { "spawn", 0, 0, 's' }, { "daemon", 1, 0, 'D' },
		{ "pool-size", 1, 0, 'P' }, { "workload", 1, 0, 'w' }, { "seed", 1, 0, 'e' },
		{ "layers", 1, 0, 'L' }, { "dim", 1, 0, 'd' }, { "hidden", 1, 0, 'H' },
		{ "heads", 1, 0, 'n' }, { "kv-heads", 1, 0, 'k' }, { "checkpoint", 1, 0, 'c' },
		{ "block-tokens", 1, 0, 'b' }, { "doc-tokens", 1, 0, 't' },
		{ "question-tokens", 1, 0, 'q' }, { "questions", 1, 0, 'Q' },
		{ "turns", 1, 0, 'T' }, { "procs", 1, 0, 'p' }, { "gen", 1, 0, 'g' },
		{ "schema", 1, 0, 'x' }, { "group-docs", 1, 0, 'G' },
		{ "group-doc-tokens", 1, 0, 'j' }, { "cold-runs", 1, 0, 'C' },
		{ "modules", 1, 0, 'M' }, { "arg", 1, 0, 'A' }, { "user", 1, 0, 'U' }, { "help", 0, 0, 'h' },
		{ "version", 0, 0, 'V' }, { "prompt", 1, 0, 'r' }, { "prompt-file", 1, 0, 'F' },
		{ "compare-cold", 0, 0, 'o' }, { "max-tokens", 1, 0, 'K' }, { 0 },
	};
	bool procs_set = false;
	int c;

	opterr = 0;	/* one line naming the bad option, not the whole help */
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		switch (c) {
		case 'S': opt.socket = optarg; break;
		case 's': opt.spawn = true; break;
		case 'D': opt.daemon = optarg; break;
		case 'P': opt.pool_size = optarg; break;
		case 'w':
			if (strlen(optarg) >= sizeof(opt.workloads))
				die("--workload %s: too long", optarg);
			strcpy(opt.workloads, optarg);
			opt.workloads_set = true;
			break;
		case 'r':
		case 'F':
			if (opt.nprompts == MAX_PROMPTS)
				die("--%s %s: at most %d prompts", c == 'r' ? "prompt" : "prompt-file",
				    optarg, MAX_PROMPTS);
			opt.prompts[opt.nprompts].arg = optarg;
			opt.prompts[opt.nprompts++].file = c == 'F';
			break;
		case 'o': opt.compare_cold = true; break;
		case 'e': opt.seed = parse_num("seed", optarg, 0, 0x7fffffffl); break;
		case 'L': opt.cfg.n_layers = parse_num("layers", optarg, 1, 64); break;
		case 'd': opt.cfg.dim = parse_num("dim", optarg, 8, 4096); break;
		case 'H': opt.cfg.hidden_dim = parse_num("hidden", optarg, 8, 16384); break;
		case 'n': opt.cfg.n_heads = parse_num("heads", optarg, 1, 256); break;
		case 'k': opt.cfg.n_kv_heads = parse_num("kv-heads", optarg, 1, 256); break;
		case 'c': opt.checkpoint = optarg; break;
		case 'b':
			opt.block_tokens = parse_num("block-tokens", optarg, 1, 1024);
			opt.block_tokens_set = true;
			break;
		case 't': opt.doc_tokens = parse_num("doc-tokens", optarg, 2, 1 << 20); break;
		case 'q': opt.question_tokens = parse_num("question-tokens", optarg, 1, 4096); break;
		case 'Q': opt.questions = parse_num("questions", optarg, 1, 1000); break;
		case 'T': opt.turns = parse_num("turns", optarg, 1, 100); break;
		case 'p': opt.procs = parse_num("procs", optarg, 1, 64); procs_set = true; break;
		case 'g': opt.gen = parse_num("gen", optarg, 0, 4096); break;
		case 'K': opt.gen = parse_num("max-tokens", optarg, 0, 4096); break;
		case 'x': opt.schema = optarg; break;
		case 'M': opt.modules = optarg; break;
		case 'U': opt.user = optarg; break;
		case 'A': {
			char *eq = strchr(optarg, '=');

			if (!eq || eq == optarg)
				die("--arg %s: expected NAME=VALUE", optarg);
			if (opt.nargs == 16)
				die("--arg %s: at most 16 arguments", optarg);
			*eq = 0;
			opt.args[opt.nargs].name = optarg;
			opt.args[opt.nargs++].value = eq + 1;
			break;
		}
		case 'C': opt.cold_runs = parse_num("cold-runs", optarg, 1, 1000); break;
		case 'G': opt.group_docs = parse_num("group-docs", optarg, 1, 256); break;
		case 'j': opt.group_doc_tokens = parse_num("group-doc-tokens", optarg, 2, 1 << 20); break;
		case 'h': usage(stdout); exit(0);
		case 'V': printf("kvdemo %s\n", KVC_VERSION_STRING); exit(0);
		case ':': die("%s needs a value (see kvdemo --help)", argv[optind - 1]);
		default:
			if (optopt)
				die("unknown option '-%c' (see kvdemo --help)", optopt);
			die("unknown option '%s' (see kvdemo --help)", argv[optind - 1]);
		}
	}
	if (optind < argc)
		die("unexpected argument '%s' (see --help)", argv[optind]);
	/* Your prompts, alone unless --workload says more; over one process
	 * unless --procs says more (multi and group keep their 3). */
	if (opt.nprompts && !opt.workloads_set)
		strcpy(opt.workloads, "prompts");
	opt.prompt_procs = procs_set ? opt.procs : 1;
	{
		char buf[sizeof(opt.workloads)], *save, *t;

		strcpy(buf, opt.workloads);
		for (t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
			if (strcmp(t, "qa") && strcmp(t, "chat") && strcmp(t, "multi") &&
			    strcmp(t, "modules") && strcmp(t, "group") && strcmp(t, "prompts"))
				die("--workload %s: unknown workload '%s' (prompts, qa, chat, multi, modules, group)",
				    opt.workloads, t);
	}
	if (want("prompts") && !opt.nprompts)
		die("--workload prompts: give prompts with --prompt TEXT or --prompt-file FILE");
	if (opt.nprompts && !want("prompts"))
		die("--workload %s: add prompts to the list to run the --prompt/--prompt-file prompts",
		    opt.workloads);
	if (opt.compare_cold && !want("prompts"))
		die("--compare-cold goes with --prompt or --prompt-file (qa and modules always compare)");
	if (opt.spawn && opt.socket)
		die("--spawn and --socket exclude each other");
	if ((opt.modules || opt.nargs || opt.user) && !opt.schema)
		die("--modules, --arg and --user go with --schema FILE");
	if (opt.daemon && !opt.spawn)
		die("--daemon PATH needs --spawn");
}

static bool want(const char *w)
{
	char buf[sizeof(opt.workloads)], *save, *t;

	strcpy(buf, opt.workloads);
	for (t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
		if (!strcmp(t, w))
			return true;
	return false;
}

/* ---- the daemon (--spawn), as kvbench starts its own ---- */

static void exe_dir(char *out, size_t len)
{
	char exe[4096], *slash;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n <= 0)
		die("cannot read /proc/self/exe: %s", strerror(errno));
	exe[n] = 0;
	slash = strrchr(exe, '/');
	if (slash)
		*slash = 0;
	snprintf(out, len, "%s", exe);
}

static void spawn_daemon(size_t page_bytes)
{
	char path[4200], dir[4096], page[32], bt[16];
	pid_t parent = getpid();
	int i, st, fd;

	if (opt.daemon) {
		snprintf(path, sizeof(path), "%s", opt.daemon);
	} else {
		exe_dir(dir, sizeof(dir));
		snprintf(path, sizeof(path), "%s/kvcached", dir);
	}
	if (access(path, X_OK))
		die("no kvcached executable at %s (%s); build it (make) or pass --daemon PATH",
		    path, strerror(errno));
	snprintf(page, sizeof(page), "%zuK", (page_bytes + 4095) / 4096 * 4);
	snprintf(bt, sizeof(bt), "%u", opt.block_tokens);
	snprintf(dmn.dir, sizeof(dmn.dir), "/tmp/kvdemo.XXXXXX");
	if (!mkdtemp(dmn.dir))
		die("mkdtemp /tmp/kvdemo.XXXXXX: %s", strerror(errno));
	snprintf(dmn.sock, sizeof(dmn.sock), "%s/kvcached.sock", dmn.dir);
	snprintf(dmn.log, sizeof(dmn.log), "%s/kvcached.log", dmn.dir);
	fflush(stdout);
	dmn.pid = fork();
	if (dmn.pid < 0)
		die("fork: %s", strerror(errno));
	if (!dmn.pid) {
		const char *argv[] = { path, "--socket", dmn.sock, "--page-size", page,
				       "--pool-size", opt.pool_size, "--block-tokens", bt,
				       "--hugepages", "off", NULL };

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		fd = open(dmn.log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(path, (char **)argv);
		_exit(127);
	}
	for (i = 0; i < 1000; i++) {
		if (kvproto_can_connect(dmn.sock)) {
			opt.socket = dmn.sock;
			printf("spawned kvcached: %s --page-size %s --pool-size %s --block-tokens %s\n",
			       path, page, opt.pool_size, bt);
			return;
		}
		if (waitpid(dmn.pid, &st, WNOHANG) == dmn.pid) {
			dmn.pid = 0;
			die("kvcached exited at start with status %d (log: %s)",
			    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), dmn.log);
		}
		usleep(10000);
	}
	die("kvcached did not accept connections on %s within 10 s", dmn.sock);
}

static void stop_daemon(void)
{
	if (dmn.pid <= 0)
		return;
	kill(dmn.pid, SIGTERM);
	waitpid(dmn.pid, NULL, 0);
	dmn.pid = 0;
	unlink(dmn.sock);
	unlink(dmn.log);
	rmdir(dmn.dir);
}

/* The socket kvdemo attaches to: --socket, else the library's default. */
static const char *socket_path(void)
{
	static char path[108];

	if (opt.socket)
		return opt.socket;
	if (!path[0] && kvproto_client_socket_path(path, sizeof(path)))
		die("the default socket path is too long ($XDG_RUNTIME_DIR?); pass --socket PATH");
	return path;
}

static kvc_t *open_cache(void)
{
	static bool warned;
	struct kvc_model km = tlm_kvc_model(&model, opt.block_tokens);
	char err[400] = "";
	struct kvc_options o = { .size = sizeof(o), .socket_path = socket_path(), .errbuf = err,
				 .errbuf_len = sizeof(err) };
	kvc_t *c;
	int rc = kvc_open(&km, &o, &c);

	if (rc == -ENOENT || rc == -ECONNREFUSED)
		die("kvc_open (%s): %s: start one there (`make run`, or build/kvcached --socket %s), or let kvdemo start its own with --spawn",
		    o.socket_path, kvc_strerror(rc), o.socket_path);
	if (rc)
		die("kvc_open (%s): %s%s%s", o.socket_path, kvc_strerror(rc), err[0] ? ": " : "",
		    err);
	/* Attached, but its pages are much smaller than the daemon's. */
	if (err[0] && !warned)
		printf("kvdemo: note: %s (or kvdemo --spawn starts a private one)\n", err);
	warned = true;
	return c;
}

/*
 * A daemon kvdemo did not start: take its block size (unless
 * --block-tokens), and say how to start one that fits when its pages are
 * too small for the model's (kvc_open's refusal would only say that).
 */
static void fit_daemon(size_t page_of_bt1)
{
	struct kvobs o;
	char err[512];
	uint64_t slot, need;

	if (kvobs_attach(socket_path(), &o, err, sizeof(err)))
		die("%s; start one (`make run`), or let kvdemo start its own with --spawn", err);
	if (!opt.block_tokens_set)
		opt.block_tokens = o.h->geo.block_tokens;
	slot = o.h->geo.page_bytes;
	kvobs_detach(&o);
	need = (uint64_t)page_of_bt1 * opt.block_tokens;
	if (need > slot)
		die("kvcached at %s has %llu-byte pages; this model needs %llu-byte pages (%u tokens per block): start one that fits, e.g. build/kvcached --socket /tmp/kvdemo.sock --page-size %lluK --block-tokens %u (then kvdemo --socket /tmp/kvdemo.sock), or use kvdemo --spawn",
		    socket_path(), (unsigned long long)slot, (unsigned long long)need,
		    opt.block_tokens, (unsigned long long)(need + 4095) / 4096 * 4, opt.block_tokens);
}

/* ---- text (the prompts are tinylm's: tools/tinylm/prompts.c) ---- */

static size_t make_doc(uint32_t *out, size_t n, uint64_t seed)
{
	size_t got = tlm_make_doc(out, n, seed);

	if (!got)
		die("out of memory");
	return got;
}

#define make_question tlm_make_question

/* ---- running one prompt ---- */

struct result {
	double ttft;		/* seconds: prefill + first token */
	double cpu;		/* of it, this thread's CPU time */
	size_t tokens, hit;
	size_t spill, remote;	/* of hit, from disk and from the remote tier */
	size_t missed, published;	/* blocks after the hits; of them published */
	uint32_t first;
	int cache_err;
	int short_err;		/* why fewer than missed were granted, or 0 */
};

/* This thread's CPU seconds: less moved by other load than wall time. */
static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prefill (timed, with the first token; its logits into `logits` if not
 * NULL) then greedy decode into gen. */
static struct result answer(struct tlm_state *s, kvc_t *c, const uint32_t *tok, size_t n,
			    const char *label, unsigned flags, uint32_t *gen, int ngen,
			    float *logits)
{
	struct result res = { 0 };
	struct tlm_run run;
	double c0 = cpu_now(), t0 = tlm_now();
	uint32_t t;
	int rc, i;

	if (n + (ngen > 0 ? ngen - 1 : 0) > (size_t)model.cfg.seq_len)
		die("a %s prompt of %zu tokens (+%d generated) is longer than the model's seq_len %d",
		    label, n, ngen, model.cfg.seq_len);
	tlm_state_reset(s);
	rc = tlm_prefill(s, c, tok, n, NULL, 0, label, flags, &run);
	if (rc)
		die("prefill of %zu tokens: %s", n, strerror(-rc));
	t = tlm_argmax(s->logits, model.cfg.vocab_size);
	res.ttft = tlm_now() - t0;
	res.cpu = cpu_now() - c0;
	res.tokens = n;
	res.hit = run.hit_tokens;
	res.first = t;
	res.cache_err = run.cache_err;
	if (run.cache_err == -ENOTCONN && cache_lost)
		__atomic_store_n(cache_lost, 1, __ATOMIC_RELEASE);
	res.spill = run.spill_tokens;
	res.remote = run.remote_tokens;
	res.missed = run.missed;
	res.published = run.published;
	res.short_err = run.short_err;
	if (logits)
		memcpy(logits, s->logits, model.cfg.vocab_size * sizeof(float));
	for (i = 0; i < ngen; i++) {
		if (gen)
			gen[i] = t;
		if (i + 1 == ngen || s->n >= s->cap || s->n >= (size_t)model.cfg.seq_len)
			break;
		if (tlm_forward(s, &t, NULL, NULL, 1, 1))
			break;
		t = tlm_argmax(s->logits, model.cfg.vocab_size);
	}
	return res;
}

static void print_text(const uint32_t *t, int n)
{
	char buf[16];

	for (int i = 0; i < n; i++)
		fputs(tlm_token_str(t[i], buf), stdout);
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(double), cmp_dbl);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- (1) long-document QA ---- */

/*
 * For q < --cold-runs a question run cold (lookup skipped: what a first
 * request costs; its blocks are published), interleaved with new
 * questions run warm (the document cached), so that both medians see the
 * same machine load. Each cold prompt is then run warm again, untimed,
 * and its logits checked bit for bit against the cold ones.
 */
static void run_qa(kvc_t *c)
{
	size_t dn = opt.doc_tokens, qn = opt.question_tokens, n = dn + qn;
	int nq = opt.questions > opt.cold_runs ? opt.questions : opt.cold_runs;
	uint32_t *tok = malloc(n * sizeof(uint32_t)), gen[64];
	float *cold_logits = malloc(model.cfg.vocab_size * sizeof(float));
	double *warm = calloc(nq, sizeof(double)), *cold = calloc(nq, sizeof(double)), cm, wm;
	double *wcpu = calloc(nq, sizeof(double)), *ccpu = calloc(nq, sizeof(double)), ccm, wcm;
	size_t reused = 0, total = 0;
	int q, same = 0, checked = 0, ng = opt.gen < 64 ? opt.gen : 64;
	struct tlm_state s;
	struct result r;

	if (!tok || !cold_logits || !warm || !cold || !wcpu || !ccpu ||
	    tlm_state_init(&s, &model, n + opt.gen + 1))
		die("out of memory");
	printf("\n== qa: %zu-token table document + %zu-token questions, %d warm, %d cold\n", dn,
	       qn, opt.questions, opt.cold_runs);
	make_doc(tok, dn, opt.seed * 1000 + 1);
	for (q = 0; q < nq; q++) {
		if (q < opt.cold_runs) {
			/* Its own question, so the warm question after it is
			 * new too: a warm run reuses the document only. */
			make_question(tok + dn, qn, 1000 + q);
			r = answer(&s, c, tok, n, "doc:tables", TLM_NO_LOOKUP, NULL, 0, NULL);
			cold[q] = r.ttft;
			ccpu[q] = r.cpu;
			memcpy(cold_logits, s.logits, model.cfg.vocab_size * sizeof(float));
			printf("  cold   q%d: TTFT %8.1f ms  (%zu tokens computed)\n", q,
			       r.ttft * 1e3, r.tokens);
		}
		if (q >= opt.questions)
			continue;
		make_question(tok + dn, qn, q);
		r = answer(&s, c, tok, n, "doc:tables", 0, gen, ng, NULL);
		if (r.cache_err)
			printf("  (cache error: %s)\n", kvc_strerror(r.cache_err));
		warm[q] = r.ttft;
		wcpu[q] = r.cpu;
		reused += r.hit;
		total += r.tokens;
		printf("  warm   q%d: TTFT %8.1f ms  reused %zu of %zu tokens; answer \"", q,
		       r.ttft * 1e3, r.hit, r.tokens);
		print_text(gen, ng);
		printf("\"\n");
		if (q < opt.cold_runs) {
			/* The cold run's prompt again, warm (untimed): it hits
			 * the document and the question blocks the cold run
			 * published; compare with the cold logits. */
			struct tlm_run run;

			make_question(tok + dn, qn, 1000 + q);
			tlm_state_reset(&s);
			tlm_prefill(&s, c, tok, n, NULL, 0, "doc:tables", TLM_NO_PUBLISH, &run);
			checked++;
			if (run.hit_tokens &&
			    !memcmp(cold_logits, s.logits, model.cfg.vocab_size * sizeof(float)))
				same++;
		}
	}
	wm = median(warm, opt.questions);
	cm = median(cold, opt.cold_runs);
	wcm = median(wcpu, opt.questions);
	ccm = median(ccpu, opt.cold_runs);
	printf("  TTFT median cold %.1f ms (%d runs), warm %.1f ms (%d runs): warm/cold = %.4f (%.1fx faster)\n",
	       cm * 1e3, opt.cold_runs, wm * 1e3, opt.questions, wm / cm, cm / wm);
	printf("  CPU time of the same: cold %.1f ms, warm %.1f ms: warm/cold = %.4f\n", ccm * 1e3,
	       wcm * 1e3, wcm / ccm);
	printf("  tokens reused %zu of %zu (hit ratio %.1f%%); warm logits bitwise equal to the cold run's: %d of %d%s\n",
	       reused, total, pct(reused, total), same, checked,
	       same == checked ? "" : "  <-- MISMATCH");
	if (same != checked)
		failures++;
	tlm_state_free(&s);
	free(tok);
	free(cold_logits);
	free(warm);
	free(cold);
	free(wcpu);
	free(ccpu);
}

/* ---- (2) multi-turn chat ---- */

static void run_chat(kvc_t *c)
{
	size_t cap = 64 + (size_t)opt.turns * (200 + opt.gen), n;
	uint32_t *tok = malloc(cap * sizeof(uint32_t)), gen[4096];
	struct tlm_state s;
	size_t reused = 0, total = 0;
	char line[256];
	int t, len;

	if (!tok || tlm_state_init(&s, &model, cap + opt.gen + 1))
		die("out of memory");
	printf("\n== chat: %d turns, each prompt extends the last\n", opt.turns);
	len = snprintf(line, sizeof(line),
		       "System: You are a terse assistant for a parts warehouse (seed %llu).\n",
		       (unsigned long long)opt.seed);
	n = tlm_tokenize(line, len, 1, tok, cap);
	for (t = 0; t < opt.turns; t++) {
		struct result r;

		len = snprintf(line, sizeof(line),
			       "User: turn %d - how many valves are left in bin %d, and where?\nAssistant:",
			       t, 7 * t + 3);
		n += tlm_tokenize(line, len, 0, tok + n, cap - n);
		r = answer(&s, c, tok, n, "chat", 0, gen, opt.gen, NULL);
		printf("  turn %d: %4zu tokens, reused %4zu, TTFT %7.1f ms\n", t, n, r.hit,
		       r.ttft * 1e3);
		reused += r.hit;
		total += n;
		for (int i = 0; i < opt.gen && n < cap; i++)
			tok[n++] = gen[i];
		if (n < cap)
			tok[n++] = TLM_BYTE0 + '\n';
	}
	printf("  tokens reused %zu of %zu (hit ratio %.1f%%)\n", reused, total,
	       pct(reused, total));
	tlm_state_free(&s);
	free(tok);
}

/* ---- worker processes (multi, group) ---- */

struct slot {
	double ttft;
	uint64_t tokens, hit;
	int done;		/* 0, 1 finished */
	int proc;
	int bad;		/* warm result differed from the cold reference */
};

/* Set (in shared memory) when a worker failed: the others stop waiting
 * for a turn that will not come. */
static int *workers_abort;

/* fork n workers running fn(i) with a fresh handle each; wait for all. */
static void run_workers(int n, void (*fn)(int))
{
	pid_t *pids = calloc(n, sizeof(pid_t));
	int i, k, st, left = n;
	pid_t w;

	if (!pids)
		die("out of memory");
	fflush(stdout);
	for (i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork: %s", strerror(errno));
		if (!pids[i]) {
			/* The daemon is the parent's: a worker that dies must not
			 * take it down for everyone (die() stops dmn.pid). */
			dmn.pid = 0;
			fn(i);
			fflush(stdout);
			_exit(0);
		}
	}
	/* In the order they end: one that fails may hold up the others. */
	while (left > 0 && (w = waitpid(-1, &st, 0)) > 0) {
		for (k = 0; k < n && pids[k] != w; k++)
			;
		if (k == n) {
			if (w == dmn.pid)	/* the daemon we spawned ended */
				dmn.pid = 0;
			continue;
		}
		left--;
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			printf("  worker %d failed (status %d)\n", k, st);
			failures++;
			if (workers_abort)
				__atomic_store_n(workers_abort, 1, __ATOMIC_RELEASE);
		}
	}
	free(pids);
}

static struct slot *slots;
static uint32_t *shared_doc;
static size_t shared_doc_n;

static void multi_worker(int p)
{
	kvc_t *c = open_cache();
	size_t n = shared_doc_n + opt.question_tokens;
	uint32_t *tok = malloc(n * sizeof(uint32_t));
	struct tlm_state s;

	if (!tok || tlm_state_init(&s, &model, n + 1))
		die("out of memory");
	memcpy(tok, shared_doc, shared_doc_n * sizeof(uint32_t));
	for (int q = 0; q < 2; q++) {
		struct slot *sl = &slots[p * 2 + q];
		struct result r;

		make_question(tok + shared_doc_n, opt.question_tokens, 100 + p * 2 + q);
		r = answer(&s, c, tok, n, "doc:multi", 0, NULL, 0, NULL);
		sl->ttft = r.ttft;
		sl->tokens = r.tokens;
		sl->hit = r.hit;
		sl->proc = p;
		sl->done = 1;
	}
	tlm_state_free(&s);
	free(tok);
	kvc_close(c);
}

static void run_multi(void)
{
	uint64_t hit = 0, tokens = 0;

	printf("\n== multi: %d processes at once, one %d-token document, 2 questions each\n",
	       opt.procs, opt.doc_tokens);
	shared_doc = malloc(opt.doc_tokens * sizeof(uint32_t));
	slots = mmap(NULL, opt.procs * 2 * sizeof(*slots), PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!shared_doc || slots == MAP_FAILED)
		die("out of memory");
	shared_doc_n = make_doc(shared_doc, opt.doc_tokens, opt.seed * 1000 + 2);
	run_workers(opt.procs, multi_worker);
	for (int i = 0; i < opt.procs * 2; i++) {
		printf("  process %d question %d: TTFT %8.1f ms, reused %4llu of %llu tokens\n",
		       slots[i].proc, i % 2, slots[i].ttft * 1e3, (unsigned long long)slots[i].hit,
		       (unsigned long long)slots[i].tokens);
		hit += slots[i].hit;
		tokens += slots[i].tokens;
	}
	printf("  tokens reused %llu of %llu (hit ratio %.1f%%)\n", (unsigned long long)hit,
	       (unsigned long long)tokens, pct(hit, tokens));
	munmap(slots, opt.procs * 2 * sizeof(*slots));
	free(shared_doc);
}

/* ---- (4) prompt modules ---- */

/* The built-in schema: a system prompt, a policy table, a union of three
 * city tables and a closing module with a param. */
static char *builtin_schema(void)
{
	static const char *cities[] = { "oslo", "lima", "pune" };
	size_t cap = 64 * 1024, len = 0;
	char *b = malloc(cap);
	uint32_t *t = malloc(2048 * sizeof(uint32_t));
	char tb[16];

	if (!b || !t)
		die("out of memory");
#define ADD(...) (len += snprintf(b + len, cap - len, __VA_ARGS__))
	ADD("<schema name=\"warehouse-s%llu\">\n", (unsigned long long)opt.seed);
	ADD("<module name=\"system\">You are the assistant of a parts warehouse. Answer from the tables below, briefly, with row ids.</module>\n");
	for (int m = 0; m < 4; m++) {
		size_t n = make_doc(t, m ? 400 : 600, opt.seed * 1000 + 10 + m);

		if (m == 1)
			ADD("<union>\n");
		ADD("<module name=\"%s\">", m ? cities[m - 1] : "policy");
		for (size_t i = 1; i < n; i++)	/* skip BOS */
			ADD("%s", tlm_token_str(t[i], tb)[0] == '\\' ? "\n" : tlm_token_str(t[i], tb));
		ADD("</module>\n");
	}
	ADD("</union>\n<module name=\"format\">Reply to <param name=\"user\" len=\"16\"/> in one line.</module>\n</schema>\n");
#undef ADD
	free(t);
	return b;
}

static void run_modules(kvc_t *c)
{
	static const char *const p1[] = { "system", "policy", "oslo", "format" };
	static const char *const p2[] = { "system", "lima", "format" };
	static const char *const p3[] = { "policy", "pune" };
	static const char *const p4[] = { "system", "policy", "lima", "format" };
	static const struct {
		const char *const *mods;
		size_t n;
		const char *user, *arg;
	} prompts[] = {
		{ p1, 4, "Which rows ship bolts from Oslo?", "Ana" },
		{ p1, 4, "What is the total qty of gears?", "Bo" },
		{ p2, 3, "Cheapest item in Lima?", "Cy" },
		{ p3, 2, "Does policy row 0007 apply to Pune?", NULL },
		{ p4, 4, "Compare Lima with the policy table.", "Ana" },
	};
	struct tlm_schema sc;
	struct tlm_state s;
	char err[512], *text = NULL;
	float *cold = malloc(model.cfg.vocab_size * sizeof(float));
	size_t reused = 0, total = 0;
	int rc, bad = 0;

	if (opt.schema) {
		rc = tlm_schema_load(&sc, opt.schema, err, sizeof(err));
	} else {
		text = builtin_schema();
		rc = tlm_schema_parse(&sc, text, strlen(text), "built-in schema", err, sizeof(err));
	}
	free(text);
	if (rc)
		die("schema: %s", err);
	printf("\n== modules: schema %s, %zu modules over %u positions%s\n", sc.name, sc.nmods,
	       sc.end, opt.schema ? "" : " (built in; --schema FILE for yours)");
	if (tlm_state_init(&s, &model, sc.end + 4096) || !cold)
		die("out of memory");
	char *modlist = opt.modules ? strdup(opt.modules) : NULL;
	static const char *all[TLM_SCHEMA_MAX_MODULES];
	size_t nmods_given = 0;

	for (size_t k = 0; k < (opt.schema ? 2 : sizeof(prompts) / sizeof(prompts[0])); k++) {
		const char *const *mods = prompts[k].mods;
		size_t nm = prompts[k].n, nargs = 0;
		struct tlm_arg arg = { "user", prompts[k].arg };
		const char *user = prompts[k].user;
		struct tlm_plan plan;
		struct tlm_run run;
		double t0, tc, tw;

		if (opt.schema) {	/* twice: the second reuses the first's modules */
			nm = 0;
			if (opt.modules) {
				char *save, *t;

				for (t = strtok_r(modlist, ",", &save); t && nm < TLM_SCHEMA_MAX_MODULES;
				     t = strtok_r(NULL, ",", &save))
					all[nm++] = t;
				if (!k)
					nmods_given = nm;
				nm = nmods_given;
			} else {
				for (size_t j = 0; j < sc.nmods; j++)
					if (sc.mods[j].union_id < 0 || !j ||
					    sc.mods[j - 1].union_id != sc.mods[j].union_id)
						all[nm++] = sc.mods[j].name;
			}
			mods = all;
			user = opt.user ? opt.user : k ? "List the key facts." : "Summarise.";
		} else if (arg.value) {
			nargs = 1;
		}
		if (tlm_plan_build(&plan, &sc, mods, nm, opt.schema ? opt.args : &arg,
				   opt.schema ? (size_t)opt.nargs : nargs, user, strlen(user), err,
				   sizeof(err)))
			die("prompt %zu: %s", k, err);
		if (plan.n > s.cap)
			die("prompt %zu: %zu tokens, over the state's %zu", k, plan.n, s.cap);
		tlm_state_reset(&s);
		t0 = tlm_now();
		rc = tlm_forward(&s, plan.tok, plan.pos, plan.lo, plan.n, 1);
		tlm_argmax(s.logits, model.cfg.vocab_size);
		tc = tlm_now() - t0;
		if (rc)
			die("prompt %zu: %s (positions up to %u; the model's seq_len is %d)", k,
			    strerror(-rc), sc.end + (unsigned)strlen(user), model.cfg.seq_len);
		memcpy(cold, s.logits, model.cfg.vocab_size * sizeof(float));
		tlm_state_reset(&s);
		t0 = tlm_now();
		rc = tlm_compose(&s, c, &sc, &plan, &run);
		tlm_argmax(s.logits, model.cfg.vocab_size);
		tw = tlm_now() - t0;
		if (rc)
			die("compose: %s", strerror(-rc));
		if (memcmp(cold, s.logits, model.cfg.vocab_size * sizeof(float)))
			bad++;
		printf("  prompt %zu [", k);
		for (size_t j = 0; j < nm; j++)
			printf("%s%s", j ? " " : "", mods[j]);
		printf("] + %zu user tokens: %4zu tokens, reused %4zu, TTFT cached %6.1f ms vs %6.1f ms uncached%s\n",
		       strlen(user), plan.n, run.hit_tokens, tw * 1e3, tc * 1e3,
		       run.cache_err ? " (cache error)" : "");
		reused += run.hit_tokens;
		total += plan.n;
		tlm_plan_free(&plan);
	}
	printf("  tokens reused %zu of %zu (hit ratio %.1f%%); cached compositions %s uncached prefills at the same positions\n",
	       reused, total, pct(reused, total),
	       bad ? "DIFFER FROM" : "bitwise equal to");
	failures += bad;
	tlm_state_free(&s);
	tlm_schema_free(&sc);
	free(cold);
	free(modlist);
}

/* ---- (5) request grouping ---- */

struct gshared {
	int next;
	int done[4096];
};

static struct gshared *gsh;
static uint32_t **gprompt;
static size_t *glen, *gorder, *gleader;
static size_t gn;
static bool gwait;

static void group_worker(int p)
{
	kvc_t *c = open_cache();
	struct tlm_state s;

	(void)p;
	if (tlm_state_init(&s, &model, opt.group_doc_tokens + opt.question_tokens + 1))
		die("out of memory");
	for (;;) {
		int k = __atomic_fetch_add(&gsh->next, 1, __ATOMIC_SEQ_CST);
		char label[KVC_MAX_LABEL + 1];
		size_t i;
		struct result r;

		if (k >= (int)gn)
			break;
		i = gorder[k];
		/* Grouped: the rest of a group starts once its leader is done
		 * (for a minute at most: a leader whose worker died must not
		 * hang the others; they only lose the reuse). */
		for (int waited = 0; gwait && gleader[i] != i && waited < 120000 &&
		     !__atomic_load_n(&gsh->done[gleader[i]], __ATOMIC_ACQUIRE); waited++)
			usleep(500);
		snprintf(label, sizeof(label), "grp:%s:d%zu", gwait ? "grouped" : "arrival",
			 i / opt.questions);
		r = answer(&s, c, gprompt[i], glen[i], label, 0, NULL, 0, NULL);
		slots[i].ttft = r.ttft;
		slots[i].tokens = r.tokens;
		slots[i].hit = r.hit;
		__atomic_store_n(&gsh->done[i], 1, __ATOMIC_RELEASE);
	}
	tlm_state_free(&s);
	kvc_close(c);
}

static void run_group(void)
{
	size_t D = opt.group_docs, Q = opt.questions, dn = opt.group_doc_tokens;
	size_t *group_of;

	gn = D * Q;
	if (gn > 4096)
		die("--group: %zu prompts, at most 4096", gn);
	printf("\n== group: %zu documents x %zu questions (%zu + %d tokens), %d worker processes\n",
	       D, Q, dn, opt.question_tokens, opt.procs);
	gprompt = calloc(gn, sizeof(*gprompt));
	glen = calloc(gn, sizeof(size_t));
	gorder = calloc(gn, sizeof(size_t));
	gleader = calloc(gn, sizeof(size_t));
	group_of = calloc(gn, sizeof(size_t));
	gsh = mmap(NULL, sizeof(*gsh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	slots = mmap(NULL, gn * sizeof(*slots), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		     -1, 0);
	if (!gprompt || !glen || !gorder || !gleader || !group_of || gsh == MAP_FAILED ||
	    slots == MAP_FAILED)
		die("out of memory");
	for (int pass = 0; pass < 2; pass++) {
		uint64_t hit = 0, tok = 0;
		double t0;
		int groups = 0;

		/* Fresh documents per pass: neither pass warms the other.
		 * Arrival order: document by document, so one document's
		 * questions are in flight together. */
		for (size_t i = 0; i < gn; i++) {
			size_t d = i / Q, q = i % Q;

			free(gprompt[i]);
			gprompt[i] = malloc((dn + opt.question_tokens) * sizeof(uint32_t));
			if (!gprompt[i])
				die("out of memory");
			make_doc(gprompt[i], dn, opt.seed * 1000 + 100 + pass * 64 + d);
			make_question(gprompt[i] + dn, opt.question_tokens, (int)q);
			glen[i] = dn + opt.question_tokens;
			gorder[i] = i;
			gleader[i] = i;
		}
		gwait = pass == 1;
		if (gwait) {
			groups = kvc_group((const uint32_t *const *)gprompt, glen, gn,
					   opt.block_tokens, gorder, group_of);
			if (groups < 0)
				die("kvc_group: %s", kvc_strerror(groups));
			for (size_t i = 0; i < gn; i++)
				gleader[i] = gorder[group_of[i]];
		}
		memset(gsh, 0, sizeof(*gsh));
		memset(slots, 0, gn * sizeof(*slots));
		t0 = tlm_now();
		run_workers(opt.procs, group_worker);
		for (size_t i = 0; i < gn; i++) {
			hit += slots[i].hit;
			tok += slots[i].tokens;
		}
		printf("  %-28s hit ratio %.1f%% (%llu of %llu tokens reused), batch wall time %.2f s\n",
		       pass ? "kvc_group order (leaders 1st):" : "arrival order:",
		       pct(hit, tok), (unsigned long long)hit,
		       (unsigned long long)tok, tlm_now() - t0);
		if (pass)
			printf("  (%d groups; order:", groups);
		for (size_t i = 0; pass && i < gn && i < 16; i++)
			printf(" %zu", gorder[i]);
		if (pass)
			printf("%s)\n", gn > 16 ? " ..." : "");
	}
	for (size_t i = 0; i < gn; i++)
		free(gprompt[i]);
	free(gprompt);
	free(glen);
	free(gorder);
	free(gleader);
	free(group_of);
	munmap(gsh, sizeof(*gsh));
	munmap(slots, gn * sizeof(*slots));
}

static void show_kvstat(void)
{
	char dir[4096], cmd[8400];

	if (!dmn.pid) {
		printf("\nkvstat%s%s shows these requests under their labels\n",
		       opt.socket ? " --socket " : "", opt.socket ? opt.socket : "");
		return;
	}
	exe_dir(dir, sizeof(dir));
	snprintf(cmd, sizeof(cmd), "%s/kvstat", dir);
	if (access(cmd, X_OK))
		return;
	usleep(200000);	/* a few daemon ticks: hit rings folded into the top table */
	printf("\n== kvstat --socket %s\n", dmn.sock);
	fflush(stdout);
	snprintf(cmd, sizeof(cmd), "'%s/kvstat' --socket '%s'", dir, dmn.sock);
	if (system(cmd))
		printf("  (kvstat failed)\n");
}

/* ---- (0) your prompts: plain automatic prefix caching ---- */

/* What one prompt did, in shared memory (its process may be a worker). */
struct pres {
	double ttft, cold;	/* seconds */
	uint64_t tokens, hit;
	int done, differ;
};

static struct {
	int next;		/* the prompt whose turn it is */
	int abort;		/* a worker failed: stop waiting */
	struct pres r[MAX_PROMPTS];
} *psh;
static uint32_t *ptok[MAX_PROMPTS];
static size_t plen[MAX_PROMPTS], pmax;
static char pname[MAX_PROMPTS][48];

/* Bytes a and b share from the start. */
static size_t common_len(const char *a, const char *b)
{
	size_t n = 0;

	while (a[n] && a[n] == b[n])
		n++;
	return n;
}

/* Up to max bytes of t from t[from], not starting or ending inside a UTF-8
 * character, control characters as spaces, appended to out[*o..]. */
static void excerpt(char *out, size_t *o, size_t cap, const char *t, size_t from, size_t max)
{
	size_t len = strlen(t), end;

	while (from > 0 && ((unsigned char)t[from] & 0xc0) == 0x80)
		from--;
	end = from + max < len ? from + max : len;
	while (end > from && end < len && ((unsigned char)t[end] & 0xc0) == 0x80)
		end--;
	for (size_t i = from; i < end && *o + 1 < cap; i++)
		out[(*o)++] = (unsigned char)t[i] < 0x20 ? ' ' : t[i];
	out[*o] = 0;
}

/*
 * The name prompt i is shown under. --prompt TEXT: its first 24 bytes, or,
 * when another --prompt starts with the same 24 (a shared system prompt),
 * its first 12, "...", and 24 from a little before where it differs from
 * the closest one, so that no two read the same; an identical text says
 * which prompt it repeats. --prompt-file: the file's name, or the path as
 * given when another file has the same name.
 */
static void prompt_name(int i)
{
	const char *a = opt.prompts[i].arg, *base = strrchr(a, '/') ? strrchr(a, '/') + 1 : a;
	char *out = pname[i];
	size_t cap = sizeof(pname[i]), o = 0, lcp = 0, len = strlen(a);
	int same = 0;

	for (int j = 0; j < opt.nprompts; j++) {
		const char *b = opt.prompts[j].arg, *bb = strrchr(b, '/') ? strrchr(b, '/') + 1 : b;
		size_t c;

		if (j == i || opt.prompts[j].file != opt.prompts[i].file)
			continue;
		if (opt.prompts[i].file) {
			if (!strcmp(base, bb))
				base = a;
			continue;
		}
		c = common_len(a, b);
		if (c == len && !b[c]) {	/* the same text: named by number */
			if (!same && j < i)
				same = j + 1;
			continue;
		}
		if (c > lcp)
			lcp = c;
	}
	if (opt.prompts[i].file) {
		size_t n = strlen(base);

		snprintf(out, cap, "%s%s", n >= cap ? "..." : "", n >= cap ? base + n - (cap - 4) : base);
		return;
	}
	if (same) {
		snprintf(out, cap, "the text of prompt %d", same);
		return;
	}
	out[o++] = '"';
	if (lcp < 24) {
		excerpt(out, &o, cap, a, 0, 24);
	} else {
		size_t from = lcp > 8 ? lcp - 8 : 0;

		excerpt(out, &o, cap, a, 0, 12);
		o += (size_t)snprintf(out + o, cap - o, "...");
		excerpt(out, &o, cap, a, from, 24);
		len -= from;
	}
	snprintf(out + o, cap - o, "%s\"", len > 24 ? "..." : "");
}

static void load_prompts(void)
{
	for (int i = 0; i < opt.nprompts; i++) {
		const char *a = opt.prompts[i].arg;
		char *text = NULL;
		size_t len = 0;

		if (opt.prompts[i].file) {
			FILE *f = fopen(a, "rb");
			size_t cap = 0, n;

			if (!f)
				die("--prompt-file %s: %s", a, strerror(errno));
			do {
				if (len == cap) {
					cap = cap ? cap * 2 : 65536;
					if (cap > (size_t)model.cfg.seq_len * 2 + 65536)
						die("--prompt-file %s: longer than the model's %d positions",
						    a, model.cfg.seq_len);
					text = realloc(text, cap);
					if (!text)
						die("out of memory");
				}
				n = fread(text + len, 1, cap - len, f);
				len += n;
			} while (n);
			if (ferror(f))
				die("--prompt-file %s: %s", a, strerror(errno));
			fclose(f);
			if (!len)
				die("--prompt-file %s: empty", a);
		} else {
			len = strlen(a);
			if (!len)
				die("--prompt: empty text");
		}
		prompt_name(i);
		/* BOS, then one token per byte. */
		if (len + 1 + (size_t)opt.gen > (size_t)model.cfg.seq_len)
			die("prompt %d (%s): %zu tokens + %d to generate exceed the model's %d positions",
			    i + 1, pname[i], len + 1, opt.gen, model.cfg.seq_len);
		ptok[i] = malloc((len + 1) * sizeof(uint32_t));
		if (!ptok[i])
			die("out of memory");
		plen[i] = tlm_tokenize(opt.prompts[i].file ? text : a, len, 1, ptok[i], len + 1);
		if (plen[i] > pmax)
			pmax = plen[i];
		free(text);
	}
}

/* Where hits other than the pool's came from: ", N from disk, M from the
 * remote tier" (static storage), or "". */
static const char *hit_tiers(const struct result *r)
{
	static char buf[96];
	size_t o = 0;

	buf[0] = 0;
	if (r->spill)
		o += (size_t)snprintf(buf, sizeof(buf), ", %zu from disk", r->spill);
	if (r->remote)
		snprintf(buf + o, sizeof(buf) - o, ", %zu from the remote tier", r->remote);
	return buf;
}

/* Why a prefill published fewer blocks than it missed. */
static const char *short_reason(int err)
{
	switch (err) {
	case -EDQUOT: return "share cap (max-share) reached";
	case -ENOSPC: return "no free pages or pin slots";
	case -EMSGSIZE: return "more blocks than one PUBLISH message carries";
	case 0: return "the daemon granted fewer pages";
	default: return kvc_strerror(err);
	}
}

/* Prompt i through the cache (its prefix found, its new blocks published),
 * then, with --compare-cold, with no cache: same logits, same answer. */
static void run_prompt(kvc_t *c, struct tlm_state *s, int i, int proc)
{
	size_t vb = model.cfg.vocab_size * sizeof(float);
	float *warm = malloc(vb), *cold = malloc(vb);
	uint32_t *gw = calloc(opt.gen + 1, sizeof(uint32_t)), *gc = calloc(opt.gen + 1, sizeof(uint32_t));
	struct pres *pr = &psh->r[i];
	char label[KVC_MAX_LABEL + 1], procs[32] = "";
	struct result r;
	int why;

	if (!warm || !cold || !gw || !gc)
		die("out of memory");
	/* What kvstat's TOP PREFIXES shows: the name this output gives it. */
	snprintf(label, sizeof(label), "prompt %d %s", i + 1, pname[i]);
	r = answer(s, c, ptok[i], plen[i], label, 0, gw, opt.gen, warm);
	pr->ttft = r.ttft;
	pr->tokens = r.tokens;
	pr->hit = r.hit;
	if (opt.prompt_procs > 1)
		snprintf(procs, sizeof(procs), ", process %d", proc);
	printf("  prompt %d (%s%s): %zu tokens, %zu hit tokens (%.1f%%%s), TTFT %.1f ms", i + 1,
	       pname[i], procs, r.tokens, r.hit, pct(r.hit, r.tokens),
	       hit_tiers(&r), r.ttft * 1e3);
	/* A failed alloc or publish is said once, as the reason it published
	 * fewer blocks than it computed. */
	why = r.short_err ? r.short_err : r.cache_err;
	if (r.cache_err && !(r.published < r.missed && r.cache_err == why))
		printf(" (cache error: %s)", kvc_strerror(r.cache_err));
	if (r.published < r.missed)
		printf("\n    published %zu of %zu blocks: %s", r.published, r.missed,
		       short_reason(why));
	if (opt.compare_cold) {
		struct result k = answer(s, NULL, ptok[i], plen[i], label, 0, gc, opt.gen, cold);

		pr->cold = k.ttft;
		pr->differ = memcmp(warm, cold, vb) || memcmp(gw, gc, opt.gen * sizeof(uint32_t));
		printf("; cold %.1f ms", k.ttft * 1e3);
		if (r.hit)
			printf(" (cached %.1fx faster)", k.ttft / r.ttft);
		printf(", logits %s", pr->differ ? "DIFFER FROM THE CACHED RUN'S" : "bitwise equal");
	}
	printf("\n    answer: \"");
	print_text(gw, opt.gen);
	printf("\"\n");
	__atomic_store_n(&pr->done, 1, __ATOMIC_RELEASE);
	free(warm);
	free(cold);
	free(gw);
	free(gc);
}

/* Worker p of --procs: prompts p, p + procs, ..., each when its turn
 * comes (the one before it has published), on its own handle. */
static void prompt_worker(int p)
{
	kvc_t *c = open_cache();
	struct tlm_state s;

	if (tlm_state_init(&s, &model, pmax + opt.gen + 1))
		die("out of memory");
	for (int i = p; i < opt.nprompts; i += opt.prompt_procs) {
		while (__atomic_load_n(&psh->next, __ATOMIC_ACQUIRE) != i)
			if (__atomic_load_n(&psh->abort, __ATOMIC_ACQUIRE))
				_exit(3);
			else
				usleep(500);
		run_prompt(c, &s, i, p);
		fflush(stdout);
		__atomic_store_n(&psh->next, i + 1, __ATOMIC_RELEASE);
	}
	tlm_state_free(&s);
	kvc_close(c);
}

static void run_prompts(kvc_t *c)
{
	uint64_t tokens = 0, hit = 0;
	double warm = 0, cold = 0;
	int differ = 0;

	printf("\n== prompts: %d, in order, through automatic prefix caching%s%s\n", opt.nprompts,
	       opt.prompt_procs > 1 ? ", spread over processes" : "",
	       opt.compare_cold ? ", each also run cold" : "");
	psh = mmap(NULL, sizeof(*psh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (psh == MAP_FAILED)
		die("out of memory");
	if (opt.prompt_procs > 1) {
		workers_abort = &psh->abort;
		run_workers(opt.prompt_procs, prompt_worker);
		workers_abort = NULL;
	} else {
		struct tlm_state s;

		if (tlm_state_init(&s, &model, pmax + opt.gen + 1))
			die("out of memory");
		for (int i = 0; i < opt.nprompts; i++)
			run_prompt(c, &s, i, 0);
		tlm_state_free(&s);
	}
	for (int i = 0; i < opt.nprompts; i++) {
		if (!psh->r[i].done)
			continue;
		tokens += psh->r[i].tokens;
		hit += psh->r[i].hit;
		warm += psh->r[i].ttft;
		cold += psh->r[i].cold;
		differ += psh->r[i].differ;
	}
	printf("  tokens %llu, hit tokens %llu (hit ratio %.1f%%), TTFT total %.1f ms",
	       (unsigned long long)tokens, (unsigned long long)hit, pct(hit, tokens),
	       warm * 1e3);
	if (opt.compare_cold)
		printf(" (cold %.1f ms); cached runs %s their cold runs", cold * 1e3,
		       differ ? "DIFFER FROM" : "bitwise equal to");
	printf("\n");
	failures += differ;
	munmap(psh, sizeof(*psh));
}

int main(int argc, char **argv)
{
	char err[512], list[sizeof(opt.workloads)], *save, *w;
	size_t page1;
	int rc;
	kvc_t *c;

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse_args(argc, argv);
	if (opt.checkpoint)
		rc = tlm_model_load(&model, opt.checkpoint, err, sizeof(err));
	else
		rc = tlm_model_generate(&model, &opt.cfg, opt.seed, err, sizeof(err));
	if (rc)
		die("model: %s", err);
	if ((want("qa") || want("multi")) &&
	    (size_t)opt.doc_tokens + opt.question_tokens + opt.gen + 1 > (size_t)model.cfg.seq_len)
		die("--doc-tokens %d + --question-tokens %d + --gen %d exceed the model's seq_len %d",
		    opt.doc_tokens, opt.question_tokens, opt.gen, model.cfg.seq_len);
	if (opt.nprompts)
		load_prompts();
	/* KV bytes of one token: the page is block_tokens of them. */
	page1 = (size_t)model.cfg.n_layers * 2 * model.kv_dim * 4;
	if (opt.spawn)
		spawn_daemon(page1 * opt.block_tokens);
	else
		fit_daemon(page1);
	printf("model %s: %d layers, dim %d, MLP %d, %d heads (%d KV), vocab %d; %zu-byte pages of %u tokens\n",
	       model.name, model.cfg.n_layers, model.cfg.dim, model.cfg.hidden_dim,
	       model.cfg.n_heads, model.cfg.n_kv_heads, model.cfg.vocab_size,
	       page1 * opt.block_tokens, opt.block_tokens);
	if (!opt.checkpoint)
		printf("(its weights are random, drawn from seed %llu: answers are not meaningful text; the KV, the timings and the reuse are real)\n",
		       (unsigned long long)opt.seed);
	cache_lost = mmap(NULL, sizeof(*cache_lost), PROT_READ | PROT_WRITE,
			  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (cache_lost == MAP_FAILED)
		die("out of memory");
	c = open_cache();
	strcpy(list, opt.workloads);
	for (w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		if (!strcmp(w, "prompts"))
			run_prompts(c);
		else if (!strcmp(w, "qa"))
			run_qa(c);
		else if (!strcmp(w, "chat"))
			run_chat(c);
		else if (!strcmp(w, "multi"))
			run_multi();
		else if (!strcmp(w, "modules"))
			run_modules(c);
		else if (!strcmp(w, "group"))
			run_group();
	}
	kvc_close(c);
	if (__atomic_load_n(cache_lost, __ATOMIC_ACQUIRE)) {
		printf("\nkvdemo: the connection to kvcached was lost (the daemon stopped or died); the prompts from then on ran without the cache\n");
		failures++;
	} else {
		show_kvstat();
	}
	stop_daemon();
	if (failures)
		printf("\nkvdemo: %d check(s) FAILED\n", failures);
	return failures ? 1 : 0;
}
