# ctest kernels_bench.output_formats: gradzip-kernels-bench honours Google
# Benchmark's output flags. A tiny filter, run three ways:
#   --benchmark_format=json   stdout parses as JSON (the summary on stderr)
#   --benchmark_format=csv    stdout is CSV only (the summary on stderr)
#   console + --benchmark_out=FILE --benchmark_out_format=json
#                             FILE parses as JSON; the summary follows the table
# Run as: cmake -DBENCH=<gradzip-kernels-bench> -DWORK_DIR=<dir> -P check_output_formats.cmake
cmake_minimum_required(VERSION 3.19)  # string(JSON)

set(_filter "^(copy|encode/fp16|decode/fp16)/1048576$")
set(_names "copy/1048576;encode/fp16/1048576;decode/fp16/1048576")
set(_summary "# encode / decode vs copy")

function(run_bench out_var err_var)
  execute_process(COMMAND "${BENCH}" "--benchmark_filter=${_filter}" --benchmark_min_time=0.01 ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gradzip-kernels-bench ${ARGN} exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

# The text must be one JSON document, nothing before or after it, with the
# three runs and the machine in its context.
function(expect_json what text)
  # string(JSON) ignores text after the first value; inside [ ] any text
  # after it is a syntax error.
  string(JSON count ERROR_VARIABLE json_error LENGTH "[${text}]")
  if(json_error OR NOT count EQUAL 1)
    message(FATAL_ERROR "${what} is not one JSON document (${json_error}):\n${text}")
  endif()
  string(JSON count ERROR_VARIABLE json_error LENGTH "${text}" benchmarks)
  if(json_error)
    message(FATAL_ERROR "${what} is not Google Benchmark JSON (${json_error}):\n${text}")
  endif()
  set(names "")
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON name GET "${text}" benchmarks ${i} name)
    list(APPEND names "${name}")
  endforeach()
  if(NOT names STREQUAL _names)
    message(FATAL_ERROR "${what}: runs [${names}], expected [${_names}]")
  endif()
  string(JSON isa ERROR_VARIABLE json_error GET "${text}" context build_isa)
  if(json_error OR isa STREQUAL "")
    message(FATAL_ERROR "${what}: no build_isa in the context (${json_error})")
  endif()
endfunction()

function(expect_contains what text needle)
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what} lacks \"${needle}\":\n${text}")
  endif()
endfunction()

# 1. JSON on stdout.
run_bench(out err --benchmark_format=json)
expect_json("stdout of --benchmark_format=json" "${out}")
expect_contains("stderr of --benchmark_format=json" "${err}" "${_summary}")

# 2. CSV on stdout: the header, then one quoted row per run, nothing else.
run_bench(out err --benchmark_format=csv)
string(STRIP "${out}" out)
string(REPLACE "\n" ";" lines "${out}")
list(POP_FRONT lines header)
if(NOT header MATCHES "^name,iterations,real_time,")
  message(FATAL_ERROR "stdout of --benchmark_format=csv starts with \"${header}\"")
endif()
list(LENGTH lines rows)
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^\"(copy|encode/fp16|decode/fp16)/1048576\",")
    message(FATAL_ERROR "stdout of --benchmark_format=csv has a line that is not a run: \"${line}\"")
  endif()
endforeach()
if(NOT rows EQUAL 3)
  message(FATAL_ERROR "stdout of --benchmark_format=csv has ${rows} rows, expected 3:\n${out}")
endif()
expect_contains("stderr of --benchmark_format=csv" "${err}" "${_summary}")

# 3. The console table and summary on stdout, JSON in the file.
set(file "${WORK_DIR}/kernels_bench_output.json")
file(REMOVE "${file}")
run_bench(out err "--benchmark_out=${file}" --benchmark_out_format=json)
file(READ "${file}" text)
expect_json("--benchmark_out file" "${text}")
expect_contains("stdout of the console format" "${out}" "copy/1048576")
expect_contains("stdout of the console format" "${out}" "${_summary}")
message(STATUS "json, csv and --benchmark_out outputs are well-formed")
