# kvcached - plain Makefile (liburing/redis style): `make`, `make run`,
# `make test`, and variants test-asan, test-tsan, fuzz. V=1 shows commands.

BUILD    ?= build
CC       ?= cc
PREFIX   ?= /usr/local

override CFLAGS += -std=gnu11 -g -Wall -Wextra -Werror -fPIC -MMD -MP -D_GNU_SOURCE \
		   -Wno-missing-field-initializers -pthread
ifeq ($(KVC_DEBUG),1)
override CFLAGS += -O0 -DKVC_DEBUG
else
override CFLAGS += -O2
endif
override LDFLAGS += -pthread

# Sanitizer builds live in their own folder and skip jemalloc (the
# sanitizers bring their own allocator).
ifeq ($(SAN),asan)
override CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
override LDFLAGS += -fsanitize=address,undefined
NOJEMALLOC := 1
endif
ifeq ($(SAN),tsan)
override CFLAGS += -fsanitize=thread -Wno-tsan
override LDFLAGS += -fsanitize=thread
NOJEMALLOC := 1
endif
JEMALLOC := $(if $(NOJEMALLOC),,-ljemalloc)
DAEMON_LIBS := -lmicrohttpd -luring -lmemcached -lsodium -lcrypto

# CUDA (issue #6): built whenever nvcc is found, GPU or not; `make NVCC=`
# or `make NO_CUDA=1` builds without. Nothing links libcudart or libcuda:
# kernels/cudadrv.c dlopen()s the driver at run time, and the kernels are
# compiled to a fatbin embedded in the library and the daemon as a C array.
# Without CUDA the cuda pool and the kernels answer "built without CUDA".
ifneq ($(NO_CUDA),1)
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
endif
ifneq ($(strip $(NVCC)),)
HAVE_CUDA := 1
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_ARCHS ?= -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	      -gencode arch=compute_90,code=compute_90
override CFLAGS += -DKVC_HAVE_CUDA -isystem $(CUDA_HOME)/include
endif

ifneq ($(V),1)
Q := @
E := @echo
else
Q :=
E := @true
endif

SHM_SRC    := $(sort $(wildcard shm/*.c))
# Formats the daemon and the tools share (the spill slot, the remote item).
FMT_SRC    := $(sort $(wildcard fmt/*.c))
DAEMON_SRC := $(sort $(wildcard daemon/*.c daemon/*/*.c))
CLIENT_SRC := $(sort $(wildcard libclient/*.c))
KERNEL_SRC := $(sort $(wildcard kernels/*.c))
UNIT_SRC   := $(sort $(wildcard tests/unit/*.c))
INTEG_SRC  := $(sort $(wildcard tests/integration/*.c))
GPU_SRC    := $(sort $(wildcard tests/gpu/*.c))
HELPER_SRC := $(sort $(wildcard tests/helpers/*.c))
TESTLIB_SRC:= $(sort $(wildcard tests/lib/*.c))

SHM_OBJ    := $(SHM_SRC:%.c=$(BUILD)/%.o)
FMT_OBJ    := $(FMT_SRC:%.c=$(BUILD)/%.o)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(BUILD)/%.o)
CLIENT_OBJ := $(CLIENT_SRC:%.c=$(BUILD)/%.o)
KERNEL_OBJ := $(KERNEL_SRC:%.c=$(BUILD)/%.o) $(if $(HAVE_CUDA),$(BUILD)/kernels/fatbin.o)
TESTLIB_OBJ:= $(TESTLIB_SRC:%.c=$(BUILD)/%.o)
DAEMON_LIB := $(filter-out $(BUILD)/daemon/main.o,$(DAEMON_OBJ))

KVCACHED   := $(BUILD)/kvcached
LIBA       := $(BUILD)/libkvclient.a
LIBSO      := $(BUILD)/libkvclient.so
SONAME     := libkvclient.so.0
TOOL_SRC   := $(sort $(wildcard tools/*.c))
TOOLS      := $(TOOL_SRC:tools/%.c=$(BUILD)/%)
# kvbench's modes, one file each (tools/bench/<mode>.c), linked into it.
BENCH_SRC  := $(sort $(wildcard tools/bench/*.c))
BENCH_OBJ  := $(BENCH_SRC:%.c=$(BUILD)/%.o)
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/unit/%)
INTEG_BIN  := $(INTEG_SRC:tests/integration/%.c=$(BUILD)/tests/integration/%)
GPU_BIN    := $(GPU_SRC:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
# Programs the Python suites run (tests/helpers/; never run as tests).
HELPER_BIN := $(HELPER_SRC:tests/helpers/%.c=$(BUILD)/tests/helpers/%)

# Fuzz targets (libFuzzer): tests/fuzz/<target>.c, linked with the shm and
# daemon objects built again with clang, coverage and ASan+UBSan in their
# own folder. Seeds: tests/fuzz/corpus/<target>/ (committed); what a run
# finds goes to $(FUZZ_BUILD)/corpus/<target>/; crash inputs that became
# regression tests: tests/fuzz/regress/<target>/, replayed on every run.
FUZZ_BUILD   ?= build-fuzz
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 300
FUZZ_SECONDS_TEST ?= 15
FUZZ_TARGETS ?=
FUZZ_SRC     := $(sort $(wildcard tests/fuzz/*.c))
FUZZ_BIN     := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
FUZZ_LIB_OBJ := $(SHM_SRC:%.c=$(FUZZ_BUILD)/%.o) $(KERNEL_SRC:%.c=$(FUZZ_BUILD)/%.o) \
		$(FMT_SRC:%.c=$(FUZZ_BUILD)/%.o) \
		$(filter-out $(FUZZ_BUILD)/daemon/main.o,$(DAEMON_SRC:%.c=$(FUZZ_BUILD)/%.o))
FUZZ_CFLAGS  := -std=gnu11 -g -O1 -Wall -Wextra -Werror -MMD -MP -D_GNU_SOURCE \
		-Wno-missing-field-initializers -pthread -fno-omit-frame-pointer \
		-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined

.SECONDARY:
.PHONY: all deps deps-run run tools programs test test-asan test-tsan check bench clean fuzz fuzz-build
all: $(KVCACHED) $(LIBA) $(LIBSO) $(TOOLS) $(UNIT_BIN) $(INTEG_BIN) $(GPU_BIN) $(HELPER_BIN)

# Every package: what `make test` and the benchmarks need too.
deps:
	$(Q)./tools/install-deps

# Only what building and running the daemon and its tools needs.
deps-run:
	$(Q)./tools/install-deps run

# Foreground daemon on the default socket and a host pool: the packages
# running needs and the daemon alone, built in parallel (no tests, no
# libraries or tools it does not link). kvstat and kvdemo: `make tools`.
run: deps-run
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) $(KVCACHED)
	$(Q)exec $(KVCACHED) --foreground $(ARGS)

# What one runs next to the daemon: kvstat, kvdemo and libkvclient.
tools: deps-run
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) $(BUILD)/kvstat $(KVDEMO) $(LIBSO)


# The plain build and the ASan+UBSan build run the same suites, so every
# run of CI also runs the sanitizers.
NPROC := $(shell nproc 2>/dev/null || echo 2)
# tests/floors checks the layout of the calls and includes, tests/sizes
# the length of files and functions (check-floors, check-sizes, below).
# Then every fuzz target replays its seeds and regression inputs and
# fuzzes for FUZZ_SECONDS_TEST seconds (before the suites, so that their
# summary line stays the last line).
test: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all
	$(Q)./tests/floors $(BUILD)
	$(Q)./tests/sizes
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) SAN=asan BUILD=build-asan all
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) fuzz-build
	$(Q)FUZZ_BUILD=$(FUZZ_BUILD) ./tests/fuzz/run -t $(FUZZ_SECONDS_TEST) $(FUZZ_TARGETS)
	$(Q)BUILDS="$(BUILD) build-asan" ./tests/run-tests

# No file of daemon/, libclient/ or kvbench in a call loop, none calling
# into a floor above its own (tests/floors reads the objects with nm).
.PHONY: check-floors
check-floors: $(KVCACHED) $(LIBA) $(BUILD)/kvbench
	$(Q)./tests/floors $(BUILD)

# No product file over 1,000 lines, no C function over 120 (tests/sizes).
.PHONY: check-sizes
check-sizes:
	$(Q)./tests/sizes

# The GPU suites (tests/gpu/): built by `all` (a compile check), run only
# here; each test skips, saying why, where there is no driver or GPU.
# Then the gather kernel against cuMemcpyDtoD (docs/BENCHMARKS.md).
.PHONY: test-gpu bench-gpu
test-gpu: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all
	$(Q)KVT_DIRS=gpu BUILDS="$(BUILD)" ./tests/run-tests

bench-gpu: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all
	$(Q)$(BUILD)/kvbench-gpu $(ARGS)

test-asan: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) SAN=asan BUILD=build-asan all
	$(Q)BUILDS=build-asan ./tests/run-tests

# TSan runs several times slower: kvbench's smoke run needs more than the
# default 120 s per binary on a loaded 2-core machine.
test-tsan: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) SAN=tsan BUILD=build-tsan all
	$(Q)BUILDS=build-tsan KVT_TIMEOUT=$${KVT_TIMEOUT:-300} ./tests/run-tests

# The crash storm's long form (issue #8) against the plain build:
# STORM_KILLS client SIGKILLs, a daemon SIGKILL and restart every 200.
# `make test` runs its short form (150 kills, 2 restarts).
STORM_KILLS ?= 1000
.PHONY: storm
storm: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all
	$(Q)KVT_STORM_KILLS=$(STORM_KILLS) KVT_TIMEOUT=$${KVT_TIMEOUT:-1800} \
		BUILDS="$(BUILD)" ./tests/run-tests integration/storm

bench: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)$(BUILD)/kvbench $(ARGS)

# `make fuzz [FUZZ_SECONDS=N] [FUZZ_TARGETS="proto config"]`: N seconds
# per target (default 300), new corpus entries kept in $(FUZZ_BUILD).
fuzz: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) fuzz-build
	$(Q)FUZZ_BUILD=$(FUZZ_BUILD) ./tests/fuzz/run -t $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-build: $(FUZZ_BIN)

# The schema target links tinylm's parser and plans (tools/tinylm/).
$(FUZZ_BUILD)/schema: $(FUZZ_BUILD)/tools/tinylm/schema.o $(FUZZ_BUILD)/tools/tinylm/plan.o

$(FUZZ_BUILD)/%.o: %.c
	$(E) "  CC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -c -o $@ $<

$(FUZZ_BIN): $(FUZZ_BUILD)/%: $(FUZZ_BUILD)/tests/fuzz/%.o $(FUZZ_LIB_OBJ)
	$(E) "  LD      $@"
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -pthread -o $@ $^ $(DAEMON_LIBS) -ldl $(FUZZ_LIBS)

# The events target decodes what it encodes with msgpack-c's unpacker (the
# daemon itself uses only the header-only packer and dlopen()s libzmq).
$(FUZZ_BUILD)/events: FUZZ_LIBS := -lmsgpackc

$(BUILD)/%.o: %.c
	$(E) "  CC      $<"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(KVCACHED): $(DAEMON_OBJ) $(FMT_OBJ) $(SHM_OBJ) $(KERNEL_OBJ)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(DAEMON_LIBS) $(JEMALLOC) -ldl

$(LIBA): $(CLIENT_OBJ) $(SHM_OBJ) $(KERNEL_OBJ)
	$(E) "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBSO): $(CLIENT_OBJ) $(SHM_OBJ) $(KERNEL_OBJ) libclient/kvclient.map
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,$(SONAME) \
		-Wl,--version-script=libclient/kvclient.map -o $@ $(CLIENT_OBJ) $(SHM_OBJ) \
		$(KERNEL_OBJ) -ldl
	$(Q)ln -sf libkvclient.so $(BUILD)/$(SONAME)

$(TOOLS): $(BUILD)/%: $(BUILD)/tools/%.o $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter-out $(LIBA),$^) $(LIBA) -lm -ldl $(TOOL_LIBS)

# kvbench also links its modes and the peers' client libraries (Redis:
# hiredis, memcached: libmemcached).
$(BUILD)/kvbench: $(BENCH_OBJ)
$(BUILD)/kvbench: TOOL_LIBS := -lhiredis -lmemcached -luring -lsodium -lcrypto
# Its remote mode starts memcached servers the way the tests do, and times
# the item MAC (fmt/remote_item.c) against its candidates.
$(BUILD)/kvbench: $(BUILD)/tests/lib/mcsrv.o $(BUILD)/fmt/remote_item.o
# Its scale mode reads /proc the way the tests do.
$(BUILD)/kvbench: $(BUILD)/tests/lib/procfs.o

# Unit tests reach internals through the objects (jemalloc's JET idea).
$(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(SHM_OBJ) $(DAEMON_LIB) $(FMT_OBJ) $(KERNEL_OBJ)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(DAEMON_LIBS) -ldl $(TEST_LIBS)

# Integration tests drive the real daemon through the real library.
$(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(TESTLIB_OBJ) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -ldl $(TEST_LIBS)

# KV events (daemon/obs/events.c): the tests subscribe with libzmq and decode
# with msgpack-c; the daemon links neither.
$(BUILD)/tests/unit/events: TEST_LIBS := -lmsgpackc
$(BUILD)/tests/integration/events: TEST_LIBS := -lzmq -lmsgpackc

$(HELPER_BIN): $(BUILD)/tests/helpers/%: $(BUILD)/tests/helpers/%.o $(TESTLIB_OBJ) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -ldl

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(TESTLIB_OBJ) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -ldl

# The kernels: nvcc -> fatbin (SASS for sm_75, sm_80 and sm_90, PTX for
# compute_90 so newer GPUs JIT it) -> a C array the library and the daemon
# hand to cuModuleLoadData. No GPU is needed to build them.
$(BUILD)/kernels/page_copy.fatbin: kernels/page_copy.cu kernels/page_ref.h
	$(E) "  NVCC    $<"
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) -fatbin -O3 -std=c++17 $(CUDA_ARCHS) -o $@ $<

$(BUILD)/kernels/fatbin.c: $(BUILD)/kernels/page_copy.fatbin
	$(E) "  GEN     $@"
	$(Q){ echo '/* Generated from kernels/page_copy.cu by the Makefile. */'; \
	  echo '#include <stddef.h>'; \
	  echo 'const unsigned char kvk_fatbin[] __attribute__((aligned(64))) = {'; \
	  od -An -v -tx1 $< | sed -e 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo '};'; \
	  echo 'const size_t kvk_fatbin_len = sizeof(kvk_fatbin);'; } >$@.tmp && mv $@.tmp $@

$(BUILD)/kernels/fatbin.o: $(BUILD)/kernels/fatbin.c
	$(E) "  CC      $<"
	$(Q)$(CC) $(filter-out -Werror -MMD -MP,$(CFLAGS)) -c -o $@ $<

# The programs the docs quote (tools/examples/), built against the library
# the way a user's program is; tests/integration/examples runs them.
EXAMPLE_SRC := $(sort $(wildcard tools/examples/*.c))
EXAMPLES    := $(EXAMPLE_SRC:tools/examples/%.c=$(BUILD)/examples/%)
all: $(EXAMPLES)
$(EXAMPLES): $(BUILD)/examples/%: tools/examples/%.c $(LIBA)
	$(E) "  CC      $<"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -Ilibclient -o $@ $< $(LIBA) $(LDFLAGS) -ldl

# Manual pages (man/NAME.SECTION.in): `all` stamps them with the version
# into $(BUILD)/man/ (the docs test lints them there); `make install`
# stamps them again with its own paths.
MAN_SRC := $(sort $(wildcard man/*.in))
MANS    := $(MAN_SRC:man/%.in=$(BUILD)/man/%)
all: $(MANS)
$(MANS): $(BUILD)/man/%: man/%.in libclient/kvclient.h
	$(E) "  GEN     $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(SUBST) $< >$@.tmp && mv $@.tmp $@

# kvbench-gpu and kvbench's gpu mode share the measurement (gpucopy.c).
$(BUILD)/kvbench-gpu: $(BUILD)/tools/bench/gpucopy.o

# tinylm (issue #7): the reference engine (tools/tinylm/*.c, a static
# library) and kvdemo, its driver. -ffp-contract=off: the cold and warm
# paths must round alike (see tools/tinylm/tinylm.h). Its tests link it
# with libkvclient; tests/unit/group tests libclient/group.c.
TINYLM_SRC := $(filter-out tools/tinylm/kvdemo.c,$(sort $(wildcard tools/tinylm/*.c)))
TINYLM_OBJ := $(TINYLM_SRC:%.c=$(BUILD)/%.o)
TINYLM_LIB := $(BUILD)/libtinylm.a
KVDEMO     := $(BUILD)/kvdemo
all: $(TINYLM_LIB) $(KVDEMO)
$(TINYLM_OBJ) $(BUILD)/tools/tinylm/kvdemo.o: override CFLAGS += -ffp-contract=off

$(TINYLM_LIB): $(TINYLM_OBJ)
	$(E) "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(KVDEMO): $(BUILD)/tools/tinylm/kvdemo.o $(TINYLM_LIB) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lm

# kvbench's ttft mode (tools/bench/ttft.c) runs tinylm.
$(BUILD)/kvbench: $(TINYLM_LIB)

$(BUILD)/tests/integration/tinylm $(BUILD)/tests/integration/flight $(BUILD)/tests/integration/kvdemo: $(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(TESTLIB_OBJ) $(TINYLM_LIB) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -lm

# The remote tier's test also writes raw items into memcached itself
# (fmt/remote_item.c, libmemcached) and runs tinylm across two hosts.
$(BUILD)/tests/integration/remote: $(BUILD)/tests/integration/remote.o $(TESTLIB_OBJ) $(BUILD)/fmt/remote_item.o $(TINYLM_LIB) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -lm -lmemcached -lsodium -lcrypto

$(BUILD)/tests/unit/tinylm $(BUILD)/tests/unit/group: $(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(TINYLM_LIB) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -lm

# The Python binding (libclient/python/kvclient) loads libkvclient.so with
# ctypes. Its optional fast path, _kvcfast (per-prompt calls and token
# conversion in C), is built here next to the library, against the headers
# of $(PYTHON) (python3-dev), when they are installed; the binding works
# without it. Not in sanitizer builds: their runtime cannot be loaded into
# a plain interpreter. Its tests (tests/python/test_*.py, run by
# tests/run-tests) use small C programs (tests/python/*.c) built here to
# write and check pages from C.
PYTHON    ?= /usr/bin/python3
PY_INC    := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_EXT    := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
ifeq ($(SAN)$(if $(wildcard $(PY_INC)/Python.h),,none),)
KVCFAST   := $(BUILD)/_kvcfast$(PY_EXT)
all: $(KVCFAST)
$(KVCFAST): libclient/python/kvclient/_kvcfast.c
	$(E) "  CC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -fvisibility=hidden -isystem $(PY_INC) -shared -o $@ $< $(LDFLAGS)
endif
# LD_PRELOAD shims the integration tests run the daemon under
# (tests/preload/), built without sanitizers: they are loaded before the
# sanitizer's runtime.
PRELOAD_SRC := $(sort $(wildcard tests/preload/*.c))
PRELOAD_SO  := $(PRELOAD_SRC:tests/preload/%.c=$(BUILD)/tests/preload/%.so)
all: $(PRELOAD_SO)
$(PRELOAD_SO): $(BUILD)/tests/preload/%.so: tests/preload/%.c
	$(E) "  CC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(filter-out -fsanitize=%,$(CFLAGS)) -shared -o $@ $< -ldl

PYTEST_SRC := $(sort $(wildcard tests/python/*.c))
PYTEST_BIN := $(PYTEST_SRC:tests/python/%.c=$(BUILD)/tests/python/%)
all: $(PYTEST_BIN)

$(PYTEST_BIN): $(BUILD)/tests/python/%: $(BUILD)/tests/python/%.o $(TESTLIB_OBJ) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -ldl

clean:
	rm -rf build build-asan build-tsan $(FUZZ_BUILD)

# `make install [PREFIX=/usr] [DESTDIR=/tmp/stage]`: programs, libkvclient
# (shared with its soname links, static, header, pkg-config), the manual
# pages, the systemd unit and sysusers.d file, the example config, which
# becomes $(SYSCONFDIR)/kvcached/kvcached.conf only if there is none yet,
# and the Python package kvclient (in PYTHONDIR, below).
BINDIR      ?= $(PREFIX)/bin
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
PKGCONFIGDIR?= $(LIBDIR)/pkgconfig
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DOCDIR      ?= $(PREFIX)/share/doc/kvcached
MANDIR      ?= $(PREFIX)/share/man
SYSCONFDIR  ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
# The one version, from libclient/kvclient.h's KVC_VERSION_MAJOR/MINOR/PATCH.
kvc_ver_part = $(shell sed -n 's/^\#define KVC_VERSION_$(1) \([0-9][0-9]*\)$$/\1/p' libclient/kvclient.h)
KVC_VERSION := $(call kvc_ver_part,MAJOR).$(call kvc_ver_part,MINOR).$(call kvc_ver_part,PATCH)
LIBREAL     := libkvclient.so.$(KVC_VERSION)
INSTALL     ?= install
# The Python package goes where the distribution's python3 looks: for
# PREFIX=/usr Debian's $(PREFIX)/lib/python3/dist-packages (any Python 3),
# else the interpreter's own folder under PREFIX (on Debian
# /usr/local/lib/python3.X/dist-packages), else its site-packages there.
# Evaluated by install only: `make` and `make run` need no Python.
PYTHON      ?= $(firstword $(wildcard /usr/bin/python3) python3)
PY_PKG      := $(sort $(wildcard libclient/python/kvclient/*.py)) libclient/python/kvclient/py.typed
PYTHONDIR   ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(shell \
	$(PYTHON) -c 'import sys, sysconfig; p = sys.argv[1].rstrip("/"); \
	d = [x for x in sys.path if x.startswith(p + "/lib/python") and x.endswith("-packages")]; \
	print(d[0] if d else sysconfig.get_path("purelib", "posix_prefix", {"base": p, "platbase": p}))' \
	$(PREFIX) 2>/dev/null || echo $(PREFIX)/lib/python3/dist-packages))
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@BINDIR@|$(BINDIR)|g' \
	    -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	    -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	    -e 's|@VERSION@|$(KVC_VERSION)|g'

# The documents the README and the manual pages point to, in $(DOCDIR).
DOC_MD      := docs/INSTALL.md docs/PYTHON.md docs/ENGINES.md docs/ARCHITECTURE.md docs/EVENTS.md

# What `make install` installs, and nothing else: the daemon, kvstat,
# kvdemo, libkvclient, and the binding's fast path where python3-dev's
# headers are there; no test and no benchmark. Building them needs only
# `make deps-run`'s packages (docs/INSTALL.md section 1;
# tests/integration/install builds this in a copy of the tree with the
# test-only libraries hidden). kvbench links the peers' client libraries
# (hiredis, OpenSSL): `make install-bench` installs it, after `make deps`.
INSTALL_BIN := $(KVCACHED) $(BUILD)/kvstat $(KVDEMO)
BENCH_BIN   := $(BUILD)/kvbench $(BUILD)/kvbench-gpu
BENCH_MAN   := man/kvbench.1.in
programs: $(INSTALL_BIN) $(LIBA) $(LIBSO) $(KVCFAST)

# man/NAME.SECTION.in -> $(MANDIR)/manSECTION/NAME.SECTION, paths filled.
install_man = for m in $(notdir $(1:%.in=%)); do \
		sec=$${m\#\#*.}; \
		$(SUBST) man/$$m.in >$(BUILD)/install/man/$$m && \
		$(INSTALL) -d $(DESTDIR)$(MANDIR)/man$$sec && \
		$(INSTALL) -m 0644 $(BUILD)/install/man/$$m $(DESTDIR)$(MANDIR)/man$$sec/$$m || exit 1; \
	done

.PHONY: install install-bench uninstall
install: programs
	$(E) "  INSTALL $(DESTDIR)$(PREFIX)"
	$(Q)$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
		$(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSCONFDIR)/kvcached
	$(Q)$(INSTALL) -m 0755 $(INSTALL_BIN) $(DESTDIR)$(BINDIR)/
	$(Q)$(INSTALL) -m 0755 $(LIBSO) $(DESTDIR)$(LIBDIR)/$(LIBREAL)
	$(Q)ln -sf $(LIBREAL) $(DESTDIR)$(LIBDIR)/$(SONAME)
	$(Q)ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libkvclient.so
	$(Q)$(INSTALL) -m 0644 $(LIBA) $(DESTDIR)$(LIBDIR)/libkvclient.a
	$(Q)$(INSTALL) -m 0644 libclient/kvclient.h $(DESTDIR)$(INCLUDEDIR)/kvclient.h
	$(Q)mkdir -p $(BUILD)/install
	$(Q)$(SUBST) libclient/kvclient.pc.in >$(BUILD)/install/kvclient.pc
	$(Q)$(SUBST) daemon/kvcached.service.in >$(BUILD)/install/kvcached.service
	$(Q)$(SUBST) daemon/kvcached.conf.example >$(BUILD)/install/kvcached.conf
	$(Q)$(INSTALL) -m 0644 $(BUILD)/install/kvclient.pc $(DESTDIR)$(PKGCONFIGDIR)/kvclient.pc
	$(Q)$(INSTALL) -m 0644 $(BUILD)/install/kvcached.service $(DESTDIR)$(UNITDIR)/kvcached.service
	$(Q)$(INSTALL) -m 0644 daemon/kvcached.sysusers $(DESTDIR)$(SYSUSERSDIR)/kvcached.conf
	$(Q)$(INSTALL) -m 0644 $(BUILD)/install/kvcached.conf $(DESTDIR)$(DOCDIR)/kvcached.conf.example
	$(Q)mkdir -p $(BUILD)/install/man
	$(Q)$(call install_man,$(filter-out $(BENCH_MAN),$(MAN_SRC)))
	$(Q)pydir='$(PYTHONDIR)'; $(INSTALL) -d "$(DESTDIR)$$pydir/kvclient" && \
		$(INSTALL) -m 0644 $(PY_PKG) "$(DESTDIR)$$pydir/kvclient/" && \
		printf '# Written by make install: where it put libkvclient.\nLIBDIR = "%s"\n' \
			'$(LIBDIR)' >"$(DESTDIR)$$pydir/kvclient/_installed.py" && \
		chmod 0644 "$(DESTDIR)$$pydir/kvclient/_installed.py"
	$(Q)if [ -n "$(KVCFAST)" ] && [ -e "$(KVCFAST)" ]; then \
		$(INSTALL) -m 0644 $(KVCFAST) "$(DESTDIR)$(PYTHONDIR)/kvclient/"; fi
	$(Q)$(INSTALL) -m 0644 $(DOC_MD) $(DESTDIR)$(DOCDIR)/
	$(Q)if [ -e $(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf ]; then \
		echo "  KEEP    $(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf (exists; new example in $(DESTDIR)$(DOCDIR))"; \
	else \
		$(INSTALL) -m 0644 $(BUILD)/install/kvcached.conf \
			$(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf; \
	fi

# kvbench and kvbench-gpu, next to the kvcached they start, and kvbench(1).
install-bench: $(BENCH_BIN)
	$(E) "  INSTALL $(DESTDIR)$(PREFIX) (kvbench)"
	$(Q)$(INSTALL) -d $(DESTDIR)$(BINDIR)
	$(Q)$(INSTALL) -m 0755 $(BENCH_BIN) $(DESTDIR)$(BINDIR)/
	$(Q)mkdir -p $(BUILD)/install/man
	$(Q)$(call install_man,$(BENCH_MAN))

# Leaves $(SYSCONFDIR)/kvcached/kvcached.conf: it is the admin's. Quiet
# like install (V=1 shows the commands). Removes kvbench's files too.
uninstall:
	$(E) "  UNINSTALL $(DESTDIR)$(PREFIX)"
	$(Q)rm -f $(addprefix $(DESTDIR)$(BINDIR)/,kvcached kvdemo $(notdir $(TOOLS))) \
		$(addprefix $(DESTDIR)$(LIBDIR)/,$(LIBREAL) $(SONAME) libkvclient.so libkvclient.a) \
		$(DESTDIR)$(INCLUDEDIR)/kvclient.h $(DESTDIR)$(PKGCONFIGDIR)/kvclient.pc \
		$(DESTDIR)$(UNITDIR)/kvcached.service $(DESTDIR)$(SYSUSERSDIR)/kvcached.conf \
		$(DESTDIR)$(DOCDIR)/kvcached.conf.example \
		$(addprefix $(DESTDIR)$(DOCDIR)/,$(notdir $(DOC_MD))) \
		$(foreach m,$(notdir $(MAN_SRC:%.in=%)),$(DESTDIR)$(MANDIR)/man$(subst .,,$(suffix $(m)))/$(m))
	$(Q)pydir='$(PYTHONDIR)'; rm -f $(addprefix "$(DESTDIR)$$pydir/kvclient/",$(notdir $(PY_PKG))) \
		"$(DESTDIR)$$pydir/kvclient/_installed.py" "$(DESTDIR)$$pydir/kvclient/"_kvcfast*.so && \
		rm -rf "$(DESTDIR)$$pydir/kvclient/__pycache__" && \
		{ rmdir "$(DESTDIR)$$pydir/kvclient" 2>/dev/null || true; }
	$(Q)rmdir $(DESTDIR)$(DOCDIR) 2>/dev/null || true

-include $(shell find $(BUILD) $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
