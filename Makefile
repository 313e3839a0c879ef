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
DAEMON_LIBS := -lmicrohttpd -luring

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
DAEMON_SRC := $(sort $(wildcard daemon/*.c))
CLIENT_SRC := $(sort $(wildcard libclient/*.c))
KERNEL_SRC := $(sort $(wildcard kernels/*.c))
UNIT_SRC   := $(sort $(wildcard tests/unit/*.c))
INTEG_SRC  := $(sort $(wildcard tests/integration/*.c))
GPU_SRC    := $(sort $(wildcard tests/gpu/*.c))
TESTLIB_SRC:= $(sort $(wildcard tests/lib/*.c))

SHM_OBJ    := $(SHM_SRC:%.c=$(BUILD)/%.o)
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
		$(filter-out $(FUZZ_BUILD)/daemon/main.o,$(DAEMON_SRC:%.c=$(FUZZ_BUILD)/%.o))
FUZZ_CFLAGS  := -std=gnu11 -g -O1 -Wall -Wextra -Werror -MMD -MP -D_GNU_SOURCE \
		-Wno-missing-field-initializers -pthread -fno-omit-frame-pointer \
		-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined

.SECONDARY:
.PHONY: all deps run test test-asan test-tsan check bench clean fuzz fuzz-build
all: $(KVCACHED) $(LIBA) $(LIBSO) $(TOOLS) $(UNIT_BIN) $(INTEG_BIN) $(GPU_BIN)

deps:
	$(Q)./tools/install-deps

# Foreground daemon on the default socket and a host pool.
run: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)exec $(KVCACHED) --foreground $(ARGS)

# The plain build and the ASan+UBSan build run the same suites, so every
# run of CI also runs the sanitizers.
NPROC := $(shell nproc 2>/dev/null || echo 2)
# Then every fuzz target replays its seeds and regression inputs and
# fuzzes for FUZZ_SECONDS_TEST seconds (before the suites, so that their
# summary line stays the last line).
test: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) SAN=asan BUILD=build-asan all
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) fuzz-build
	$(Q)FUZZ_BUILD=$(FUZZ_BUILD) ./tests/fuzz/run -t $(FUZZ_SECONDS_TEST) $(FUZZ_TARGETS)
	$(Q)BUILDS="$(BUILD) build-asan" ./tests/run-tests

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

test-tsan: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) SAN=tsan BUILD=build-tsan all
	$(Q)BUILDS=build-tsan ./tests/run-tests

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
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -pthread -o $@ $^ $(DAEMON_LIBS) -ldl

$(BUILD)/%.o: %.c
	$(E) "  CC      $<"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(KVCACHED): $(DAEMON_OBJ) $(SHM_OBJ) $(KERNEL_OBJ)
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
$(BUILD)/kvbench: TOOL_LIBS := -lhiredis -lmemcached -luring

# Unit tests reach internals through the objects (jemalloc's JET idea).
$(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(SHM_OBJ) $(DAEMON_LIB) $(KERNEL_OBJ)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(DAEMON_LIBS) -ldl

# Integration tests drive the real daemon through the real library.
$(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(TESTLIB_OBJ) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -ldl

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

$(BUILD)/tests/integration/tinylm $(BUILD)/tests/integration/flight: $(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(TESTLIB_OBJ) $(TINYLM_LIB) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -lm

$(BUILD)/tests/unit/tinylm $(BUILD)/tests/unit/group: $(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(TINYLM_LIB) $(LIBA)
	$(E) "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -lm

clean:
	rm -rf build build-asan build-tsan $(FUZZ_BUILD)

# `make install [PREFIX=/usr] [DESTDIR=/tmp/stage]`: programs, libkvclient
# (shared with its soname links, static, header, pkg-config), the systemd
# unit and sysusers.d file, and the example config, which becomes
# $(SYSCONFDIR)/kvcached/kvcached.conf only if there is none yet.
BINDIR      ?= $(PREFIX)/bin
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
PKGCONFIGDIR?= $(LIBDIR)/pkgconfig
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DOCDIR      ?= $(PREFIX)/share/doc/kvcached
SYSCONFDIR  ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
KVC_VERSION := $(shell sed -n 's/^.define KVC_VERSION_STRING "\(.*\)"/\1/p' libclient/kvclient.h)
LIBREAL     := libkvclient.so.$(KVC_VERSION)
INSTALL     ?= install
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@BINDIR@|$(BINDIR)|g' \
	    -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	    -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	    -e 's|@VERSION@|$(KVC_VERSION)|g'

.PHONY: install uninstall
install: all
	$(E) "  INSTALL $(DESTDIR)$(PREFIX)"
	$(Q)$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
		$(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSCONFDIR)/kvcached
	$(Q)$(INSTALL) -m 0755 $(KVCACHED) $(wildcard $(TOOLS)) $(KVDEMO) $(DESTDIR)$(BINDIR)/
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
	$(Q)$(INSTALL) -m 0644 docs/INSTALL.md $(DESTDIR)$(DOCDIR)/INSTALL.md
	$(Q)if [ -e $(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf ]; then \
		echo "  KEEP    $(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf (exists; new example in $(DESTDIR)$(DOCDIR))"; \
	else \
		$(INSTALL) -m 0644 $(BUILD)/install/kvcached.conf \
			$(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf; \
	fi

# Leaves $(SYSCONFDIR)/kvcached/kvcached.conf: it is the admin's.
uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,kvcached kvdemo $(notdir $(TOOLS))) \
		$(addprefix $(DESTDIR)$(LIBDIR)/,$(LIBREAL) $(SONAME) libkvclient.so libkvclient.a) \
		$(DESTDIR)$(INCLUDEDIR)/kvclient.h $(DESTDIR)$(PKGCONFIGDIR)/kvclient.pc \
		$(DESTDIR)$(UNITDIR)/kvcached.service $(DESTDIR)$(SYSUSERSDIR)/kvcached.conf \
		$(DESTDIR)$(DOCDIR)/kvcached.conf.example $(DESTDIR)$(DOCDIR)/INSTALL.md
	-rmdir $(DESTDIR)$(DOCDIR) 2>/dev/null

-include $(shell find $(BUILD) $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
