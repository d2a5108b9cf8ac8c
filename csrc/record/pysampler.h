// The Python stack sampler (see pysampler.cc): a native thread that reads
// every thread's Python frames at random times (without the GIL on 3.11, with
// it elsewhere) and queues interned stacks for the writer (PYSTACKS and
// PYSAMPLES chunks, docs/format.md).
#pragma once
#include <string>

struct PyMethodDef;  // Python.h stays out of the writer's includes

namespace stepscope {

// pysampler_start(hz) -> '' or the reason, pysampler_stop(), pysampler_status() -> dict.
PyMethodDef* pysampler_methods();
// Writer thread, every flush: new strings, frames and stacks, then the queued samples.
void encode_pysamples(std::string& out);
// Stops and joins the sampler thread; the caller must not hold the GIL.
void stop_pysampler();
// STEPSCOPE_PYSAMPLE_METHOD=gil (gil_walk) and STEPSCOPE_PYSAMPLE_RT (realtime), for the next start.
void set_pysampler_options(bool gil_walk, bool realtime);

}  // namespace stepscope
