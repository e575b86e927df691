# Fails unless README.md quotes the examples verbatim, so the examples in the
# README are always the ones the build compiles and runs.
file(READ "${SOURCE_DIR}/README.md" readme)
foreach(name compress_gradient.cc allreduce.cc ddp_hook.py adamw.py)
  file(READ "${SOURCE_DIR}/examples/${name}" example)
  string(FIND "${readme}" "${example}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "README.md does not contain examples/${name} verbatim: update the README's example")
  endif()
endforeach()
