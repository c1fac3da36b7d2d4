#!/usr/bin/env bash
# loom as a library, the way its users get it. Each mode is one CTest test
# (tests/package/CMakeLists.txt):
#   install       cmake --install the main build into a staging prefix, then move
#                 it elsewhere (the package must not depend on where it was installed)
#   paths         no installed file names the build directory (nor, in text
#                 files, the source directory)
#   examples      build every examples/* project against the installed prefix
#                 alone (find_package(loom), nothing of the build tree on any
#                 path) and run it; the same for examples/custom_op with
#                 pkg-config instead of CMake; the installed apps' --version
#   shared        configure, build and install loom with BUILD_SHARED_LIBS=ON
#                 (library and apps only), then check the installed libraries'
#                 and apps' RUNPATH and what they load, and build and run the
#                 examples against that prefix
#   subproject    the examples built in one project that brings loom in with
#                 FetchContent (add_subdirectory underneath): loom's apps,
#                 tests and benchmarks stay off, the parent's build type unset
# usage: package.sh MODE SOURCE_DIR BUILD_DIR WORK_DIR LOOMRUN [CMAKE_ARGS...]
#   LOOMRUN: the build tree's loomrun, for the subproject mode (whose loom has no apps);
#   CMAKE_ARGS: passed to every configure (compiler, compiler launcher).
set -euo pipefail
mode=$1 source=$(realpath "$2") build=$(realpath "$3") work=$4 loomrun=$5
shift 5
cmake_args=("$@")
mkdir -p "$work"
work=$(realpath "$work")
jobs=2
data=/usr/share/datasets/fashion-mnist

fail() {
  echo "package $mode: FAILED: $*" >&2
  exit 1
}

# The environment a user's shell has: nothing that points at loom's build tree.
clean_env=(env -u CMAKE_PREFIX_PATH -u loom_DIR -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH -u CPATH -u LIBRARY_PATH
           -u CPLUS_INCLUDE_PATH)

# Installs BUILD into WORK/staging-NAME, then moves it to WORK/NAME.
install_prefix() {
  local from=$1 name=$2
  rm -rf "$work/staging-$name" "$work/$name"
  cmake --install "$from" --prefix "$work/staging-$name" >"$work/install-$name.log"
  mv "$work/staging-$name" "$work/$name"
  [[ -f "$work/$name/lib/cmake/loom/loomConfig.cmake" ]] || fail "no lib/cmake/loom/loomConfig.cmake in $work/$name"
  [[ -f "$work/$name/include/loom/loom.h" ]] || fail "no include/loom/loom.h in $work/$name"
  echo "installed $from into $work/$name (by way of staging-$name)"
}

# No file under PREFIX names DIR (any file), nor SOURCE (text files).
check_paths() {
  local prefix=$1 dir=$2 found
  found=$(grep -rlaF "$dir" "$prefix" || true)
  [[ -z "$found" ]] || fail "installed files name the build directory $dir:
$found"
  found=$(grep -rlIF "$source" "$prefix" || true)
  [[ -z "$found" ]] || fail "installed text files name the source directory $source:
$found"
  echo "no installed file names $dir or (text) $source"
}

# Configures and builds examples/NAME against PREFIX alone into WORK/TAG-NAME.
build_example() {
  local prefix=$1 name=$2 tag=$3 dir="$work/$3-$2"
  rm -rf "$dir"
  "${clean_env[@]}" cmake -S "$source/examples/$name" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "${cmake_args[@]}" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; fail "configuring examples/$name against $prefix"; }
  local found
  found=$(sed -n 's/^loom_DIR:PATH=//p' "$dir/CMakeCache.txt")
  [[ "$found" == "$prefix/lib/cmake/loom" ]] || fail "examples/$name found loom in '$found', not in $prefix/lib/cmake/loom"
  cmake --build "$dir" -j "$jobs" >"$dir.build.log" 2>&1 || { cat "$dir.build.log"; fail "building examples/$name"; }
  grep -q "warning" "$dir.build.log" && { cat "$dir.build.log"; fail "examples/$name compiles with warnings"; }
  echo "built examples/$name against $prefix"
}

# Runs the three examples from WORK/TAG-*, the DDP one started by LAUNCHER.
run_examples() {
  local tag=$1 launcher=$2 output accuracy
  [[ -d "$data" ]] || fail "$data is missing (Debian package dataset-fashion-mnist, installed by scripts/setup.sh)"
  output=$("$work/$tag-convnet_fashion_mnist/convnet_fashion_mnist" "$data" 30) || fail "convnet_fashion_mnist: $output"
  echo "$output"
  accuracy=$(sed -n 's/^test accuracy after 30 steps: //p' <<<"$output")
  # Chance is 0.1; 30 steps of SGD reach about 0.75.
  awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.5) }' || fail "convnet_fashion_mnist: test accuracy '$accuracy' < 0.5"

  output=$("$launcher" --standalone --nproc_per_node=2 "$work/$tag-ddp_own_model/ddp_own_model" 5 "$work/$tag-ddp_own_model-checkpoints" 2>&1) ||
    fail "ddp_own_model under loomrun: $output"
  echo "$output"
  accuracy=$(sed -n 's/^2 processes, test accuracy //p' <<<"$output")
  # Chance is about 0.33 (three rings); 5 epochs reach about 0.95.
  awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.85) }' || fail "ddp_own_model: test accuracy '$accuracy' < 0.85"

  output=$("$work/$tag-custom_op/custom_op") || fail "custom_op: $output"
  echo "$output"
  grep -q "^gradcheck passed" <<<"$output" || fail "custom_op: no 'gradcheck passed'"
  grep -q "^gradcheck rejected the wrong backward" <<<"$output" || fail "custom_op: the wrong backward was not rejected"
}

# FILE loads every loom library it needs (at least one) from PREFIX/lib.
check_loads_from_prefix() {
  local file=$1 prefix=$2 line name path count=0
  while read -r line; do
    name=${line%% =>*}
    path=$(sed -n 's/.*=> \(.*\) (0x[0-9a-f]*)$/\1/p' <<<"$line")
    [[ -n "$path" && "$(realpath "$path")" == "$prefix/lib/$name" ]] || fail "$file: '$line' is not from $prefix/lib"
    count=$((count + 1))
  done < <("${clean_env[@]}" ldd "$file" | grep libloom_ | sed 's/^[[:space:]]*//')
  (( count > 0 )) || fail "$file loads no loom library"
}

# The installed apps run and report the version of the sources.
check_apps() {
  local prefix=$1 shared=$2 version
  version=$(sed -n 's/^project(loom VERSION \([0-9.]*\).*/\1/p' "$source/CMakeLists.txt")
  for app in train_mnist train_resnet50_cifar loomrun; do
    local output
    output=$("${clean_env[@]}" "$prefix/bin/$app" --version) || fail "$app --version: $output"
    grep -q "^$app $version\$" <<<"$output" || fail "$app --version does not begin with '$app $version': $output"
    grep -q ", $shared libraries," <<<"$output" || fail "$app --version does not say '$shared libraries': $output"
  done
  echo "installed apps: --version says $version, $shared libraries"
}

case "$mode" in
  install)
    install_prefix "$build" static
    ;;
  paths)
    check_paths "$work/static" "$build"
    ;;
  examples)
    prefix="$work/static"
    for name in convnet_fashion_mnist ddp_own_model custom_op; do build_example "$prefix" "$name" static; done
    run_examples static "$prefix/bin/loomrun"
    [[ -f "$prefix/bin/train_mnist" ]] && check_apps "$prefix" static
    # pkg-config, as a Makefile user would.
    flags=$("${clean_env[@]}" PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs loom) ||
      fail "pkg-config --cflags --libs loom"
    echo "pkg-config --cflags --libs loom: $flags"
    # shellcheck disable=SC2086  # the flags are words
    c++ -std=c++20 -O1 -o "$work/pkg-config-custom_op" "$source/examples/custom_op/main.cpp" $flags ||
      fail "compiling examples/custom_op/main.cpp with pkg-config's flags"
    run_output=$("$work/pkg-config-custom_op") && grep -q "^gradcheck passed" <<< "$run_output" ||
      fail "custom_op built with pkg-config: $run_output"
    echo "examples/custom_op builds and runs with pkg-config's flags"
    ;;
  shared)
    dir="$work/shared-build"
    rm -rf "$dir"
    "${clean_env[@]}" cmake -S "$source" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLOOM_CUDA=OFF \
      -DLOOM_BUILD_APPS=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCHMARKS=OFF "${cmake_args[@]}" >"$dir.configure.log" 2>&1 ||
      { cat "$dir.configure.log"; fail "configuring loom with BUILD_SHARED_LIBS=ON"; }
    cmake --build "$dir" -j "$jobs" >"$dir.build.log" 2>&1 || { tail -50 "$dir.build.log"; fail "building loom's shared libraries"; }
    install_prefix "$dir" shared
    prefix="$work/shared"
    check_paths "$prefix" "$dir"
    for library in core ops nn optim data dist; do
      [[ -f "$prefix/lib/libloom_$library.so" ]] || fail "no lib/libloom_$library.so"
      [[ -f "$prefix/lib/libloom_$library.a" ]] && fail "a static lib/libloom_$library.a in a shared build"
    done
    for file in bin/train_mnist bin/loomrun lib/libloom_dist.so; do
      runpath=$(readelf -d "$prefix/$file" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
      [[ "$runpath" == *'$ORIGIN/../lib'* ]] || fail "$file: RUNPATH '$runpath' lacks \$ORIGIN/../lib"
      check_loads_from_prefix "$prefix/$file" "$prefix"
    done
    echo "shared libraries and apps: RUNPATH \$ORIGIN/../lib, loom's libraries loaded from $prefix/lib"
    check_apps "$prefix" shared
    for name in convnet_fashion_mnist ddp_own_model custom_op; do build_example "$prefix" "$name" shared; done
    for name in convnet_fashion_mnist ddp_own_model custom_op; do
      check_loads_from_prefix "$work/shared-$name/$name" "$prefix"
    done
    run_examples shared "$prefix/bin/loomrun"
    ;;
  subproject)
    dir="$work/subproject"
    rm -rf "$dir"
    # First without a build type: loom must leave it unset, and build no apps, tests or benchmarks.
    # Without the cudnn-frontend headers, as a user's FetchContent of loom's
    # repository has them (scripts/fetch-cudnn-frontend.sh puts them in .deps,
    # which git does not track); the main build compiles the fused graphs.
    "${clean_env[@]}" cmake -S "$source/tests/package/subproject" -B "$dir" -DLOOM_SOURCE_DIR="$source" \
      -DLOOM_EXAMPLES_DIR="$source/examples" -DFETCHCONTENT_BASE_DIR="$dir/_deps" \
      -DCUDNN_FRONTEND_INCLUDE_DIR="$dir/no-cudnn-frontend" "${cmake_args[@]}" \
      >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; fail "configuring a project that adds loom with FetchContent"; }
    grep "subproject:" "$dir.configure.log"
    "${clean_env[@]}" cmake "$dir" -DCMAKE_BUILD_TYPE=Release >>"$dir.configure.log" 2>&1 ||
      { cat "$dir.configure.log"; fail "reconfiguring with CMAKE_BUILD_TYPE=Release"; }
    cmake --build "$dir" -j "$jobs" >"$dir.build.log" 2>&1 || { tail -50 "$dir.build.log"; fail "building the subproject"; }
    for name in convnet_fashion_mnist ddp_own_model custom_op; do
      ln -sfn "$dir/$name" "$work/subproject-$name"
    done
    run_examples subproject "$loomrun"
    ;;
  *)
    fail "unknown mode (install, paths, examples, shared, subproject)"
    ;;
esac
echo "package $mode: passed"
