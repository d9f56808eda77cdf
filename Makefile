# sparkmono build.  `make` builds build/libsparkmono.a and build/sparkmono; `make demo` runs
# tools/demo.sh on them; `make test` builds and runs every CPU test and ends with "N passed,
# N failed"; `make test-asan` does the same under ASan + UBSan in build-asan/ (CPU only);
# `make shared` builds build/libsparkmono.so, the library of the Python binding (python/).
#
# The build fits the machine: the CUDA backend (src/cuda/, for sm_90a, into
# build/libsparkmono_cuda.a, linked into the CLI with SM_HAVE_CUDA) is compiled when a GPU is
# present and nvcc is found, or when asked (`make CUDA=1`; `make gpu-test`, the GPU test
# program, implies it); otherwise the CPU engine alone is built and the link line says so.
# `make CUDA=0` never builds it.  Jobs run on every core unless -j says otherwise.  Output is
# one short line a built file (`V=1` shows the commands); warnings and errors always show.
# What it needs is installed on first use: the system packages (tools/deps.txt) before the
# first compile, the tests' Python packages (tools/py-requirements.txt) into a virtual
# environment (build/venv) before the first test run.  We rejected a configure step: a
# newcomer types `make demo`, and the machine decides the rest.

B        ?= build
CC       ?= gcc
OPT      ?= -O2
SAN      ?=
V        ?= 0
# The tests' Python virtual environment: one for every build directory (build-asan too).
VENV     ?= build/venv
# the single-letter flags make was given (s: silent, n: dry run)
FLAGS1   := $(firstword -$(MAKEFLAGS))
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif
ifneq ($(V),1)
MAKEFLAGS += --no-print-directory
endif

BASE_CFLAGS := -std=c11 $(OPT) -g -Wall -Wextra -Werror -MMD -MP -D_GNU_SOURCE \
               -Isrc -Iinclude -Itools $(SAN)
CFLAGS   := $(BASE_CFLAGS)
LDLIBS   := -l:libjansson.a -l:libpcre2-8.a -l:libutf8proc.a -lm -lpthread
# `sparkmono serve`'s HTTP server: libmicrohttpd linked statically, its TLS library (gnutls,
# never used: the server speaks plain HTTP) dynamically.
SERVE_LIBS := -l:libmicrohttpd.a -lgnutls
NVCC     ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))

# CUDA: 1 builds the CUDA backend, 0 does not; left unset, the machine decides (CUDA_WHY says
# why not, on the link line).
ifeq ($(origin CUDA),undefined)
  ifneq ($(filter gpu-test %/gpu_test,$(MAKECMDGOALS)),)
    CUDA := 1
  else ifeq ($(shell { nvidia-smi -L || test -e /dev/nvidia0; } >/dev/null 2>&1 && echo 1),1)
    CUDA := $(if $(NVCC),1,0)
    CUDA_WHY := a GPU but no nvcc found
  else
    CUDA := 0
    CUDA_WHY := no GPU found
  endif
endif
ifeq ($(CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 needs nvcc (CUDA 13): put it on the PATH or pass NVCC=/path/to/nvcc)
  endif
endif

# The host folders (docs/architecture.md): base, model, parallel, backend, cpu, constrain,
# jinja, engine, serve, testing; src/cuda/ is compiled by nvcc below.
HOST_DIRS := base model parallel backend cpu constrain jinja engine serve testing
LIB_SRC  := $(wildcard $(HOST_DIRS:%=src/%/*.c))
CLI_SRC  := $(wildcard tools/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(B)/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(B)/tests/%)

ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# -fPIC: the same objects go into the CLI and into libsparkmono.so (`make CUDA=1 shared`)
NVFLAGS  := -std=c++17 -O3 -g -lineinfo -gencode=arch=compute_90a,code=sm_90a \
            -Xcompiler -Wall,-Wextra,-Werror,-fPIC -Werror all-warnings -MMD -MP -Isrc -Iinclude
CU_SRC   := $(sort $(shell find src/cuda -name '*.cu'))
CU_OBJ   := $(CU_SRC:%.cu=$(B)/%.o)
CU_LIB   := $(B)/libsparkmono_cuda.a
CFLAGS   += -DSM_HAVE_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart_static -ldl -lrt -lpthread -lstdc++
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/*.c tests/gpu/*.cu bench/gpu/*.c bench/gpu/*.cu))
GPU_TEST_OBJ := $(patsubst %.c,$(B)/%.o,$(patsubst %.cu,$(B)/%.o,$(GPU_TEST_SRC)))
# NCCL's header (types only: src/cuda/comm/ loads libnccl.so.2 with dlopen), put once into
# the build directory by tools/nccl-header.sh.
NCCL_INC := $(B)/nccl/include
COMM_OBJ := $(filter $(B)/src/cuda/comm/%,$(CU_OBJ))
endif

# Quiet output: `say` prints one line a built file (nothing with V=1, which echoes commands,
# or with -s).
ifeq ($(V),1)
Q   :=
say  =
else ifneq ($(findstring s,$(FLAGS1)),)
Q   := @
say  =
else
Q   := @
say  = @printf '  %-5s %s\n' '$(1)' '$(2)'
endif

.PHONY: all test test-asan demo gpu-test shared clean
# Keep every intermediate (test objects) so `make test` ends with the runner's summary line.
.SECONDARY:
all: $(B)/libsparkmono.a $(B)/sparkmono

# The flags an object was compiled with, one file per kind: when they change (CUDA=1 after a
# CPU-only build, other OPT or SAN), the file is rewritten and the objects of that kind are
# rebuilt (under -n the file is only made phony, so the dry run lists them).
FLAGS_C   := $(B)/.flags-c
FLAGS_PIC := $(B)/.flags-pic
FLAGS_CU  := $(B)/.flags-cu
PIC_CFLAGS := $(BASE_CFLAGS) -fPIC $(if $(filter 1,$(CUDA)),-DSM_HAVE_CUDA=1 -I$(CUDA_HOME)/include)
TXT_C     = $(CC) $(CFLAGS)
TXT_PIC   = $(CC) $(PIC_CFLAGS)
TXT_CU    = $(NVCC) $(NVFLAGS)
flags_stamp = $(if $(shell printf '%s\n' '$($(2))' | cmp -s - $(1) 2>/dev/null || echo x),$(if \
    $(findstring n,$(FLAGS1)),$(eval .PHONY: $(1)),$(shell mkdir -p $(dir $(1)) && printf '%s\n' '$($(2))' >$(1))))
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(call flags_stamp,$(FLAGS_C),TXT_C)
$(call flags_stamp,$(FLAGS_PIC),TXT_PIC)
ifeq ($(CUDA),1)
$(call flags_stamp,$(FLAGS_CU),TXT_CU)
endif
endif

# System packages (tools/deps.txt, the one list): installed when missing, checked once per
# build directory.
DEPS_OK  := $(B)/.deps-ok
$(DEPS_OK): tools/deps.txt tools/deps.sh
	$(Q)sh tools/deps.sh
	@mkdir -p $(dir $@) && touch $@

$(B)/%.o: %.c $(FLAGS_C) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(B)/%.o: %.cu $(FLAGS_CU) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)
	$(Q)$(NVCC) $(NVFLAGS) -c $< -o $@

$(B)/libsparkmono.a: $(LIB_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

ifeq ($(CUDA),1)
$(NCCL_INC)/nccl.h:
	$(Q)CUDA_HOME=$(CUDA_HOME) sh tools/nccl-header.sh $(B)/nccl
$(COMM_OBJ): NVFLAGS += -I$(NCCL_INC)
$(COMM_OBJ): | $(NCCL_INC)/nccl.h

$(CU_LIB): $(CU_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^
endif

# The two archives reference each other (engine -> CUDA backend -> C loader), hence the group.
LINK_LIBS = -Wl,--start-group $(B)/libsparkmono.a $(CU_LIB) -Wl,--end-group $(LDLIBS) $(CUDA_LIBS)

$(B)/sparkmono: $(CLI_OBJ) $(B)/libsparkmono.a $(CU_LIB) $(FLAGS_C)
	$(if $(filter 1,$(CUDA)),$(call say,LD,$@),$(if $(findstring s,$(FLAGS1)),,@printf '  %-5s %s\n' LD '$@ (the CPU engine only: $(or $(CUDA_WHY),CUDA=0); make CUDA=1 adds the CUDA backend)'))
	$(Q)$(CC) $(CFLAGS) $(CLI_OBJ) $(LINK_LIBS) $(SERVE_LIBS) -o $@

# The Python binding's shared library (python/): the library's sources again, compiled with
# -fPIC into $(B)/pic/, linked against the system's shared jansson and pcre2 (their static
# archives are not position-independent).  With CUDA=1 it holds the CUDA backend too (the
# same -fPIC objects as the CLI's: `make B=build-cuda CUDA=1 shared`, then SPARKMONO_LIB=
# build-cuda/libsparkmono.so); without, the CPU backend only.  The server (src/serve/) stays
# out: it needs libmicrohttpd, and Python has its own HTTP servers; so does its chat-template
# renderer (src/jinja/, with utf8proc), which only the server and the CLI use.
PIC_SRC  := $(filter-out src/serve/% src/jinja/%,$(LIB_SRC))
PIC_OBJ  := $(PIC_SRC:%.c=$(B)/pic/%.o)
SO_LIBS  := -ljansson -lpcre2-8 -lm -lpthread $(if $(filter 1,$(CUDA)),$(CUDA_LIBS))
$(B)/pic/%.o: %.c $(FLAGS_PIC) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)
	$(Q)$(CC) $(PIC_CFLAGS) -c $< -o $@
$(B)/libsparkmono.so: $(PIC_OBJ) $(CU_OBJ)
	$(call say,LD,$@)
	$(Q)$(CC) $(PIC_CFLAGS) -shared -Wl,--no-undefined $(PIC_OBJ) $(CU_OBJ) $(SO_LIBS) -o $@
shared: $(B)/libsparkmono.so

# Each CPU test is its own program; tests may use tools/cli.c for shared parsing.
$(B)/tests/%: $(B)/tests/%.o $(B)/libsparkmono.a $(CU_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(CFLAGS) $< $(LINK_LIBS) -o $@

# The tests' Python packages, in a virtual environment made once (tools/deps.sh --venv).  A
# failure (no network) is reported by the test recipe, after the build, as one line.
PY_OK    := $(VENV)/.installed
PY_ERR   := $(VENV).error
$(PY_OK): tools/py-requirements.txt tools/deps.sh | $(DEPS_OK)
	@sh tools/deps.sh --venv $(VENV) tools/py-requirements.txt 2>$(PY_ERR) && rm -f $(PY_ERR) || true

test: all $(TESTS) $(B)/libsparkmono.so $(PY_OK)
	@if [ -s $(PY_ERR) ]; then cat $(PY_ERR) >&2; exit 2; fi
	@SM_VENV=$(VENV) SM_TEST_VERBOSE=$(V) sh tests/run.sh $(B)

test-asan:
	$(Q)$(MAKE) B=build-asan CUDA=0 OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" test

demo: all
	@sh tools/demo.sh $(B)

ifeq ($(CUDA),1)
$(B)/gpu_test: $(GPU_TEST_OBJ) $(B)/libsparkmono.a $(CU_LIB)
	$(call say,LD,$@)
	$(Q)$(CC) $(CFLAGS) $(GPU_TEST_OBJ) $(LINK_LIBS) -o $@
gpu-test: all $(B)/gpu_test
endif

clean:
	rm -rf build build-asan

-include $(wildcard $(patsubst %.o,%.d,$(LIB_OBJ) $(CLI_OBJ) $(TESTS:%=%.o) $(PIC_OBJ) $(CU_OBJ) $(GPU_TEST_OBJ)))
