# Builds zonal's C libraries and installs them as C libraries install:
#
#   make install PREFIX=$HOME/.local        # or PREFIX=/usr/local (then run ldconfig as root)
#   make install PREFIX=/usr DESTDIR=/tmp/stage   # staged, as a package build does
#   make uninstall PREFIX=...  [DESTDIR=...]      # removes exactly the files install wrote
#
# A Makefile rather than a script because `make install PREFIX= DESTDIR=` is the interface
# packagers' tools already drive (Debian's dh_auto_install, RPM's %make_install) and C users
# already type; make comes with build-essential, which the peers of `zonal bench` need anyway.
# The variables follow zstd's and lz4's Makefiles: PREFIX, LIBDIR, INCLUDEDIR, PKGCONFIGDIR,
# each also accepted in its GNU lower-case spelling (prefix, libdir, ...), and DESTDIR.
#
# Installed, for zonal and for zonal_numab (NUMA balancing, which carries zonal's C ABI too):
#   $(LIBDIR)/libzonal.so.0.1.0   the shared library; its SONAME is libzonal.so.0
#   $(LIBDIR)/libzonal.so.0       link to it: the name programs record and the loader seeks
#   $(LIBDIR)/libzonal.so         link to it: what `-lzonal` finds
#   $(LIBDIR)/libzonal.a          the static library
#   $(INCLUDEDIR)/zonal.h, zonal_numab.h   (zonal.h includes zonal_numab.h beside it)
#   $(PKGCONFIGDIR)/zonal.pc, zonal_numab.pc
# No ldconfig here: a staged install (DESTDIR) must not touch the build machine's cache, and
# the links it would make are made above.

prefix ?= /usr/local
PREFIX ?= $(prefix)
exec_prefix ?= $(PREFIX)
libdir ?= $(exec_prefix)/lib
LIBDIR ?= $(libdir)
includedir ?= $(PREFIX)/include
INCLUDEDIR ?= $(includedir)
pkgconfigdir ?= $(LIBDIR)/pkgconfig
PKGCONFIGDIR ?= $(pkgconfigdir)

CARGO ?= cargo
# Passed to cargo as --target-dir, so the build and the files installed are the same ones
# whatever cargo's own configuration says.
CARGO_TARGET_DIR ?= target
RELEASE := $(CARGO_TARGET_DIR)/release

INSTALL ?= install
INSTALL_DATA ?= $(INSTALL) -m 644
INSTALL_LIB ?= $(INSTALL) -m 755

# What a Rust staticlib needs from the system, as `cargo rustc -p zonal-numab --lib
# --crate-type staticlib -- --print native-static-libs` prints it (Rust 1.95, Linux, glibc;
# no dependency of zonal links a native library of its own, so it is the standard library's
# list, the same for both archives). The static link in tests/suite/install.rs checks it suffices.
NATIVE_STATIC_LIBS ?= -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc

# The first `version = "..."` / `description = "..."` line of a manifest: its [package]'s.
cargo_field = $(shell sed -n 's/^$(2) *= *"\(.*\)"/\1/p' $(1) | head -n 1)
# The ABI number in the SONAME build.rs gives the library (`-soname,libNAME.so.N`).
soname_major = $(shell sed -n 's/.*-soname,lib$(2)\.so\.\([0-9][0-9]*\).*/\1/p' $(1) | head -n 1)

ZONAL_VERSION := $(call cargo_field,crates/zonal/Cargo.toml,version)
ZONAL_DESCRIPTION := $(call cargo_field,crates/zonal/Cargo.toml,description)
ZONAL_SOMAJOR := $(call soname_major,crates/zonal/build.rs,zonal)
NUMAB_VERSION := $(call cargo_field,crates/numab/Cargo.toml,version)
NUMAB_DESCRIPTION := $(call cargo_field,crates/numab/Cargo.toml,description)
NUMAB_SOMAJOR := $(call soname_major,crates/numab/build.rs,zonal_numab)

ifeq ($(strip $(ZONAL_VERSION)),)
$(error no `version = "..."` line in crates/zonal/Cargo.toml; run make from the repository root)
endif
ifeq ($(strip $(NUMAB_VERSION)),)
$(error no `version = "..."` line in crates/numab/Cargo.toml; run make from the repository root)
endif
ifeq ($(strip $(ZONAL_SOMAJOR)),)
$(error crates/zonal/build.rs sets no `-soname,libzonal.so.N`: the installed links would not match the library)
endif
ifeq ($(strip $(NUMAB_SOMAJOR)),)
$(error crates/numab/build.rs sets no `-soname,libzonal_numab.so.N`: the installed links would not match the library)
endif

# A directory under the prefix is written `${prefix}/...` in a .pc file, so the file reads
# as pkg-config files usually do; one elsewhere (LIBDIR=/usr/lib/x86_64-linux-gnu with
# PREFIX=/usr is under it) is written as it is.
pc_path = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))

# $(call install_lib,NAME,VERSION,SOMAJOR): the shared library under its full version, the
# two links libtool's layout gives it (both to the file, so each resolves in one step), the
# archive.
define install_lib
	$(INSTALL_LIB) $(RELEASE)/lib$(1).so "$(DESTDIR)$(LIBDIR)/lib$(1).so.$(2)"
	ln -sf lib$(1).so.$(2) "$(DESTDIR)$(LIBDIR)/lib$(1).so.$(3)"
	ln -sf lib$(1).so.$(2) "$(DESTDIR)$(LIBDIR)/lib$(1).so"
	$(INSTALL_DATA) $(RELEASE)/lib$(1).a "$(DESTDIR)$(LIBDIR)/lib$(1).a"
endef

# $(call install_pc,NAME,VERSION,DESCRIPTION): a pkg-config file for -lNAME. No `Requires:
# zonal` in zonal_numab.pc: libzonal_numab carries zonal's code and C ABI itself, and linking
# both libraries would give a program two copies of the allocator with separate state.
define install_pc
	printf '%s\n' \
	  'prefix=$(PREFIX)' \
	  'libdir=$(call pc_path,$(LIBDIR))' \
	  'includedir=$(call pc_path,$(INCLUDEDIR))' \
	  '' \
	  'Name: $(1)' \
	  'Description: $(3)' \
	  'Version: $(2)' \
	  'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir} -l$(1)' \
	  'Libs.private: $(NATIVE_STATIC_LIBS)' \
	  > "$(DESTDIR)$(PKGCONFIGDIR)/$(1).pc"
	chmod 644 "$(DESTDIR)$(PKGCONFIGDIR)/$(1).pc"
endef

INSTALLED_FILES = \
	$(LIBDIR)/libzonal.so.$(ZONAL_VERSION) \
	$(LIBDIR)/libzonal.so.$(ZONAL_SOMAJOR) \
	$(LIBDIR)/libzonal.so \
	$(LIBDIR)/libzonal.a \
	$(LIBDIR)/libzonal_numab.so.$(NUMAB_VERSION) \
	$(LIBDIR)/libzonal_numab.so.$(NUMAB_SOMAJOR) \
	$(LIBDIR)/libzonal_numab.so \
	$(LIBDIR)/libzonal_numab.a \
	$(INCLUDEDIR)/zonal.h \
	$(INCLUDEDIR)/zonal_numab.h \
	$(PKGCONFIGDIR)/zonal.pc \
	$(PKGCONFIGDIR)/zonal_numab.pc

.PHONY: all build install uninstall check-dirs

all: build

# cargo decides what is stale; when everything is built this takes a second. The workspace's
# libraries (zonal and zonal-numab; the command has none), with the features `cargo test
# --workspace` gives their dependencies: after a `cargo test --release`, nothing recompiles.
build:
	$(CARGO) build --release --target-dir "$(CARGO_TARGET_DIR)" --workspace --lib

# Every directory must be absolute: the .pc files tell compilers where the files are, and
# an empty PREFIX would install into /lib and /include.
check-dirs:
	@for d in "PREFIX=$(PREFIX)" "LIBDIR=$(LIBDIR)" "INCLUDEDIR=$(INCLUDEDIR)" "PKGCONFIGDIR=$(PKGCONFIGDIR)"; do \
	  case "$${d#*=}" in \
	    /*) ;; \
	    *) echo "make: $${d%%=*} must be an absolute directory, not '$${d#*=}' (e.g. PREFIX=$$HOME/.local)" >&2; exit 2 ;; \
	  esac; \
	done

install: check-dirs build
	$(INSTALL) -d "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(INCLUDEDIR)" "$(DESTDIR)$(PKGCONFIGDIR)"
	$(call install_lib,zonal,$(ZONAL_VERSION),$(ZONAL_SOMAJOR))
	$(call install_lib,zonal_numab,$(NUMAB_VERSION),$(NUMAB_SOMAJOR))
	$(INSTALL_DATA) include/zonal.h include/zonal_numab.h "$(DESTDIR)$(INCLUDEDIR)"
	$(call install_pc,zonal,$(ZONAL_VERSION),$(ZONAL_DESCRIPTION))
	$(call install_pc,zonal_numab,$(NUMAB_VERSION),$(NUMAB_DESCRIPTION))

# The files alone: the directories may hold other software's files, or have been there
# before install.
uninstall: check-dirs
	rm -f $(foreach f,$(INSTALLED_FILES),"$(DESTDIR)$(f)")
