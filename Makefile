# sparkmono build.  `make` builds build/libsparkmono.a and build/sparkmono; `make test` builds
# and runs every CPU test and ends with "N passed, N failed"; `make test-asan` does the same
# under ASan + UBSan in build-asan/ (CPU only).  When nvcc is present, src/cuda/*.cu is
# compiled for sm_90a into build/libsparkmono_cuda.a and linked into the CLI (SM_HAVE_CUDA);
# `make gpu-test` builds the GPU test program (run it on a machine with a Hopper GPU); `make
# shared` builds build/libsparkmono.so, the library of the Python binding (python/).

B        ?= build
CC       ?= gcc
OPT      ?= -O2
SAN      ?=
CFLAGS   := -std=c11 $(OPT) -g -Wall -Wextra -Werror -MMD -MP -D_GNU_SOURCE \
            -Isrc -Iinclude -Itools $(SAN)
LDLIBS   := -l:libjansson.a -l:libpcre2-8.a -lm -lpthread
# `sparkmono serve`'s HTTP server: libmicrohttpd linked statically, its TLS library (gnutls,
# never used: the server speaks plain HTTP) dynamically.
SERVE_LIBS := -l:libmicrohttpd.a -lgnutls
NVCC     ?= $(shell command -v nvcc 2>/dev/null)
CUDA     ?= $(if $(NVCC),1,0)

LIB_SRC  := $(wildcard src/*.c src/cpu/*.c)
CLI_SRC  := $(wildcard tools/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(B)/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(B)/tests/%)

ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVFLAGS  := -std=c++17 -O3 -g -lineinfo -gencode=arch=compute_90a,code=sm_90a \
            -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -MMD -MP -Isrc -Iinclude
CU_SRC   := $(wildcard src/cuda/*.cu src/cuda/*/*.cu)
CU_OBJ   := $(CU_SRC:%.cu=$(B)/%.o)
CU_LIB   := $(B)/libsparkmono_cuda.a
CFLAGS   += -DSM_HAVE_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart_static -ldl -lrt -lpthread -lstdc++
GPU_TEST_SRC := $(wildcard tests/gpu/*.c tests/gpu/*.cu bench/gpu/*.c bench/gpu/*.cu)
# NCCL's header (types only: src/cuda/comm/ loads libnccl.so.2 with dlopen), fetched once into
# the build directory by tools/nccl-header.sh.
NCCL_INC := $(B)/nccl/include
COMM_OBJ := $(filter $(B)/src/cuda/comm/%,$(CU_OBJ))
endif

.PHONY: all test test-asan demo gpu-test shared clean
# Keep every intermediate (test objects) so `make test` ends with the runner's summary line.
.SECONDARY:
all: $(B)/libsparkmono.a $(B)/sparkmono

# System packages (tools/deps.txt, the one list): installed when missing, checked once per
# build directory.
DEPS_OK  := $(B)/.deps-ok
$(DEPS_OK): tools/deps.txt tools/deps.sh
	@sh tools/deps.sh
	@mkdir -p $(dir $@) && touch $@

$(B)/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/%.o: %.cu | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(B)/libsparkmono.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

ifeq ($(CUDA),1)
$(NCCL_INC)/nccl.h:
	@CUDA_HOME=$(CUDA_HOME) sh tools/nccl-header.sh $(B)/nccl
$(COMM_OBJ): NVFLAGS += -I$(NCCL_INC)
$(COMM_OBJ): | $(NCCL_INC)/nccl.h

$(CU_LIB): $(CU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
endif

# The two archives reference each other (engine -> CUDA backend -> C loader), hence the group.
LINK_LIBS = -Wl,--start-group $(B)/libsparkmono.a $(CU_LIB) -Wl,--end-group $(LDLIBS) $(CUDA_LIBS)

$(B)/sparkmono: $(CLI_OBJ) $(B)/libsparkmono.a $(CU_LIB)
	$(CC) $(CFLAGS) $(CLI_OBJ) $(LINK_LIBS) $(SERVE_LIBS) -o $@

# The Python binding's shared library (python/, CPU backend only): the library's sources again,
# compiled with -fPIC into $(B)/pic/ without the CUDA backend, linked against the system's
# shared jansson and pcre2 (their static archives are not position-independent).  The server
# (src/serve*) stays out: it needs libmicrohttpd, and Python has its own HTTP servers.
PIC_SRC  := $(filter-out src/serve%,$(LIB_SRC))
PIC_OBJ  := $(PIC_SRC:%.c=$(B)/pic/%.o)
PIC_CFLAGS = $(filter-out -DSM_HAVE_CUDA=1,$(CFLAGS)) -fPIC
SO_LIBS  := -ljansson -lpcre2-8 -lm -lpthread
$(B)/pic/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(PIC_CFLAGS) -c $< -o $@
$(B)/libsparkmono.so: $(PIC_OBJ)
	$(CC) $(PIC_CFLAGS) -shared -Wl,--no-undefined $^ $(SO_LIBS) -o $@
shared: $(B)/libsparkmono.so

# Each CPU test is its own program; tests may use tools/cli.c for shared parsing.
$(B)/tests/%: $(B)/tests/%.o $(B)/libsparkmono.a $(CU_LIB)
	$(CC) $(CFLAGS) $< $(LINK_LIBS) -o $@

test: all $(TESTS) $(B)/libsparkmono.so
	@sh tests/run.sh $(B)

test-asan:
	$(MAKE) B=build-asan CUDA=0 OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" test

demo: all
	@sh tools/demo.sh $(B)

ifeq ($(CUDA),1)
GPU_TEST_OBJ := $(patsubst %.c,$(B)/%.o,$(patsubst %.cu,$(B)/%.o,$(GPU_TEST_SRC)))
$(B)/gpu_test: $(GPU_TEST_OBJ) $(B)/libsparkmono.a $(CU_LIB)
	$(CC) $(CFLAGS) $(GPU_TEST_OBJ) $(LINK_LIBS) -o $@
gpu-test: all $(B)/gpu_test
endif

clean:
	rm -rf build build-asan

-include $(shell find $(B) -name '*.d' 2>/dev/null)
