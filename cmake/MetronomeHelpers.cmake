# Shared compile settings and the helpers every CMakeLists.txt in the tree uses.

set(METRONOME_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wimplicit-fallthrough)
if(METRONOME_WERROR)
  list(APPEND METRONOME_WARNINGS -Werror)
endif()

add_library(metronome_compile_options INTERFACE)
target_compile_options(metronome_compile_options INTERFACE ${METRONOME_WARNINGS})
if(METRONOME_ARCH)
  target_compile_options(metronome_compile_options INTERFACE -march=${METRONOME_ARCH})
endif()
if(METRONOME_SANITIZE)
  target_compile_options(metronome_compile_options INTERFACE
    -fsanitize=${METRONOME_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(metronome_compile_options INTERFACE -fsanitize=${METRONOME_SANITIZE})
  # gcc warns (-Wtsan) at every std::atomic_thread_fence it inlines, and Boost.Asio's handler
  # allocator uses one; TSan does not model fences, so a race it reports across such a fence
  # would be a false positive to suppress. Our own code has no fences (the pool uses acq/rel
  # atomics), so the warning is not an error here.
  if(METRONOME_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(metronome_compile_options INTERFACE -Wno-tsan)
  endif()
endif()

# metronome_cc_library(NAME name SRCS ... DEPS ...): one library per module folder, includes rooted
# at src/.
function(metronome_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(metronome_${ARG_NAME} STATIC ${ARG_SRCS})
  add_library(metronome::${ARG_NAME} ALIAS metronome_${ARG_NAME})
  target_include_directories(metronome_${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(metronome_${ARG_NAME} PUBLIC metronome_compile_options ${ARG_DEPS})
endfunction()

# metronome_cc_test(NAME name SRCS ... DEPS ... [LABELS label]): a GoogleTest binary registered with
# ctest; every test in it is discovered separately. One label per binary (default `unit`):
# gtest_discover_tests writes PROPERTIES unquoted, so a list of labels would break the property
# list. Presets filter labels by regex, so `unit-tsan` (the threaded tests) counts as `unit` for the
# asan preset and as `tsan` for the tsan preset.
function(metronome_cc_test)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  # Collected for the `metronome_unit_tests` target (tests/CMakeLists.txt): the sanitizer presets
  # build the test binaries only, not the CLI and the benchmarks.
  set_property(GLOBAL APPEND PROPERTY METRONOME_TEST_BINARIES ${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE metronome_compile_options ${ARG_DEPS} GTest::gtest
    GTest::gtest_main)
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${ARG_NAME} PRIVATE METRONOME_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${ARG_NAME}
    PROPERTIES LABELS "${ARG_LABELS}"
               ENVIRONMENT "METRONOME_SHARED_DIR=${PROJECT_SOURCE_DIR}/../shared;OMP_NUM_THREADS=2"
    DISCOVERY_TIMEOUT 60)
endfunction()
