// plancache's torch operators on CUDA tensors, with their repeated calls kept in C++.
//
// What it is for (issue 42, item 3): a served call's host time. Each of
// plancache's operators (plancache/torch/_ops.py) is a Python implementation
// that the dispatcher calls for every call: ~7 us of dispatcher-to-Python
// before any of plancache's own work, where torch's kernels cost ~5 us in all.
// This file registers one boxed kernel for the CUDA key of every operator.
//
// How it stays exact: it decides nothing. A call whose arguments it has not
// seen (the key: every argument, a tensor's device, dtype, sizes and strides,
// every scalar and list exactly) runs the Python implementation, as before,
// through `learn_call` (plancache.torch.native.py), which also hands back
// every cuDNN launch the implementation made (the frontend's raw-pointer
// execute, its buffers, how many were outputs). The call is kept only when
// that replay reproduces it by construction: every buffer of every launch is
// one of the call's tensors, an output a launch of the same call allocated,
// or one of the plan's persistent constants; the call's results are such
// outputs (the same tensors, not copies); and no tensor was written after
// its launch by anything but cuDNN (version counters). A later call with the
// same key allocates the outputs with the same geometry, fills the same
// launches with the new addresses and returns the same outputs: the
// implementation's own launches, without its Python. Anything else (torch's
// function ran, a tensor was made or written in Python, a launch had no
// raw form) is not kept, and every call of that key keeps running Python.
// Python clears the table whenever its own per-process table changes
// (plancache.functional._table), so a kept call never outlives the geometry
// entry it was learned from.
//
// The launches run on this file's own cuDNN handles (one per thread and
// device, on the current torch stream, destroyed with the thread), each plan
// through the frontend's raw-pointer execute (a Python call, the GIL taken),
// with plancache.run's workspace for the stream (one per stream for the
// process, grown and never freed: a captured CUDA graph replays the address
// it captured). A stream capturing a CUDA graph runs the Python
// implementation.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>
#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// ---- cuDNN's handle calls, from the library the frontend loaded ---------------------------------

using CudnnCreate = int (*)(void**);
using CudnnSetStream = int (*)(void*, void*);
using CudnnDestroy = int (*)(void*);

struct Cudnn {
  CudnnCreate create = nullptr;
  CudnnSetStream set_stream = nullptr;
  CudnnDestroy destroy = nullptr;
};

Cudnn& cudnn() {
  static Cudnn fns;
  return fns;
}

// ---- the key --------------------------------------------------------------------------------------

struct KeyWriter {
  std::string bytes;
  template <typename T>
  void put(T value) {
    bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
};

// False where an argument has no exact key (a tensor list, an object): such a call always runs Python.
bool key_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t nargs, std::string* out) {
  KeyWriter w;
  w.bytes.reserve(160);
  w.put(reinterpret_cast<uintptr_t>(&op.schema()));
  for (size_t i = stack.size() - nargs; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        w.put('u');
        continue;
      }
      w.put('T');
      w.put(static_cast<int8_t>(t.device().type()));
      w.put(static_cast<int16_t>(t.device().index()));
      w.put(static_cast<int8_t>(t.scalar_type()));
      w.put(static_cast<int8_t>(t.layout()));
      const int64_t dim = t.dim();
      w.put(dim);
      for (int64_t d = 0; d < dim; ++d) {
        w.put(t.size(d));
        w.put(t.stride(d));
      }
    } else if (v.isNone()) {
      w.put('N');
    } else if (v.isInt()) {
      w.put('i');
      w.put(v.toInt());
    } else if (v.isDouble()) {
      w.put('d');
      w.put(v.toDouble());
    } else if (v.isBool()) {
      w.put('b');
      w.put(v.toBool());
    } else if (v.isString()) {
      const auto& s = v.toStringRef();
      w.put('s');
      w.put(s.size());
      w.bytes.append(s);
    } else if (v.isIntList()) {
      auto list = v.toIntList();
      w.put('I');
      w.put(list.size());
      for (int64_t x : list) w.put(x);
    } else if (v.isBoolList()) {
      auto list = v.toBoolList();
      w.put('B');
      w.put(list.size());
      for (bool x : list) w.put(x);
    } else if (v.isDoubleList()) {
      auto list = v.toDoubleList();
      w.put('D');
      w.put(list.size());
      for (double x : list) w.put(x);
    } else {
      return false;
    }
  }
  *out = std::move(w.bytes);
  return true;
}

// ---- a kept call ----------------------------------------------------------------------------------

enum class From : uint8_t { Arg, Output, Constant };

struct Source {
  From from;
  int32_t index;  // the argument's position, the output's or the constant's
};

struct OutputSpec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  c10::Device device;
};

struct Launch {
  py::object run;                // the plan's raw-pointer execute
  std::vector<Source> buffers;   // in the pack's order (the raw execute's)
  int64_t workspace = 0;         // bytes
  std::string function;          // whose plan (plancache.functional's counters count each launch)
};

struct Returned {
  bool list = false;             // a Tensor[] return
  std::vector<int32_t> outputs;  // output indices; -1: None
};

struct Kept {
  c10::DeviceIndex device = 0;
  std::vector<OutputSpec> outputs;
  std::vector<at::Tensor> constants;
  std::vector<Launch> launches;
  std::vector<Returned> returns;
  mutable std::atomic<int64_t> calls{0};

  // The last reference may go on a thread without the GIL (a replay that outlived a clear()). Never dropped
  // under the table's lock: a thread holding the GIL may be waiting for that lock.
  ~Kept() {
    py::gil_scoped_acquire gil;
    for (auto& launch : launches) launch.run = py::object();
  }
};

struct Table {
  std::mutex lock;
  std::unordered_map<std::string, std::shared_ptr<Kept>> kept;
  std::unordered_map<std::string, int32_t> refused;  // keys seen and not kept: how many times
  int64_t generation = 0;
};

Table& table() {
  static Table* t = new Table();  // never destroyed: its Python objects outlive no interpreter
  return *t;
}

constexpr size_t MAX_KEPT = 4096;
constexpr int32_t MAX_TRIES = 3;  // a key learned this many times without being kept stays Python's

struct Implementations {
  std::unordered_map<std::string, py::object> by_operator;  // "plancache::layer_norm" -> Python function
  py::object learn_call;                                    // _native.learn_call(impl, args)
  py::object workspace;  // plancache.functional._table.stream_workspace(device, stream, bytes)
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

Implementations& implementations() {
  static Implementations* i = new Implementations();
  return *i;
}

// ---- handles per thread, workspaces per stream -----------------------------------------------------

struct ThreadHandle {
  void* handle = nullptr;
  void* stream = nullptr;
};

// A thread's handles, destroyed with the thread (a program's short-lived threads leave none behind).
struct ThreadHandles {
  std::unordered_map<int, ThreadHandle> by_device;
  ~ThreadHandles() {
    for (auto& [device, h] : by_device) {
      if (h.handle != nullptr && cudnn().destroy != nullptr) cudnn().destroy(h.handle);
    }
  }
};

thread_local ThreadHandles t_handles;

// A stream's workspace is plancache.run's own (its WorkspacePool: one per device and stream for the process,
// grown, never freed, a captured CUDA graph replaying the address it captured), asked for through Python only
// when this stream has none yet or needs a larger one. Not allocated here: under torch.compile's
// mode="reduce-overhead" the thread that runs the program allocates into the CUDA graphs' private pool, and a
// workspace kept from there fails the step ("2 tensor(s) in the cudagraph pool not tracked as outputs", GPU
// run 49); the pool allocates outside it (plancache.run.execution.TorchRuntime.empty), as its launches need.
struct Workspaces {
  std::mutex lock;
  std::unordered_map<void*, at::Tensor> by_stream;  // the pool's buffer; an outgrown one stays the pool's
};

Workspaces& workspaces() {
  static Workspaces* w = new Workspaces();  // never destroyed (above)
  return *w;
}

void* handle_on(c10::DeviceIndex device, void* stream) {
  ThreadHandle& h = t_handles.by_device[device];
  if (h.handle == nullptr) {
    TORCH_CHECK(cudnn().create != nullptr, "plancache native: cuDNN's functions are not loaded");
    TORCH_CHECK(cudnn().create(&h.handle) == 0, "plancache native: cudnnCreate failed");
  }
  if (h.stream != stream) {
    TORCH_CHECK(cudnn().set_stream(h.handle, stream) == 0, "plancache native: cudnnSetStream failed");
    h.stream = stream;
  }
  return h.handle;
}

// The GIL is held (replay's launches).
void* workspace_on(c10::DeviceIndex device, void* stream, int64_t need) {
  if (need <= 0) return nullptr;
  Workspaces& all = workspaces();
  {
    std::lock_guard<std::mutex> guard(all.lock);
    auto found = all.by_stream.find(stream);
    if (found != all.by_stream.end() && found->second.numel() >= need) return found->second.data_ptr();
  }
  // Not under the lock: Python may hand the GIL to a thread that then waits for the lock.
  py::object provider = implementations().workspace;
  TORCH_CHECK(provider, "plancache native: no workspace provider");
  py::object given = provider(static_cast<int64_t>(device), reinterpret_cast<intptr_t>(stream), need);
  TORCH_CHECK(THPVariable_Check(given.ptr()), "plancache native: the workspace provider gave no tensor");
  at::Tensor buffer = THPVariable_Unpack(given.ptr());
  TORCH_CHECK(buffer.numel() >= need, "plancache native: a workspace smaller than asked");
  std::lock_guard<std::mutex> guard(all.lock);
  at::Tensor& kept = all.by_stream[stream];
  if (!kept.defined() || kept.numel() < buffer.numel()) kept = buffer;
  return kept.data_ptr();
}

// ---- CUDA graph capture --------------------------------------------------------------------------

using CuStreamIsCapturing = int (*)(void*, int*);

// The driver's cuStreamIsCapturing, from the libcuda the process loaded (its soname is the same everywhere),
// or nullptr where it is not found.
CuStreamIsCapturing cu_stream_is_capturing() {
  static const CuStreamIsCapturing fn = []() -> CuStreamIsCapturing {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    return lib == nullptr ? nullptr : reinterpret_cast<CuStreamIsCapturing>(dlsym(lib, "cuStreamIsCapturing"));
  }();
  return fn;
}

// Whether the call's stream is capturing a CUDA graph (torch.compile's mode="reduce-overhead", a
// torch.cuda.graph). A capture runs the Python implementation, neither replayed nor learned: the graph replays
// what it captured, so a kept call would save nothing there, and the Python path is the one GPU runs verified
// under capture. An error from the query counts as capturing; no query found (no driver library in the
// process), as not capturing.
bool capturing(const torch::jit::Stack& stack, size_t nargs, c10::DeviceType type) {
  if (type != c10::kCUDA) return false;
  const CuStreamIsCapturing query = cu_stream_is_capturing();
  if (query == nullptr) return false;
  for (size_t i = stack.size() - nargs; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().device().type() != type) continue;
    c10::impl::VirtualGuardImpl impl(type);
    void* stream = impl.getStream(c10::Device(type, v.toTensor().device().index())).native_handle();
    int status = 0;
    return query(stream, &status) != 0 || status != 0;
  }
  return false;
}

// ---- the replay -----------------------------------------------------------------------------------

bool replay(const Kept& kept, torch::jit::Stack* stack, size_t nargs, size_t nreturns, c10::DeviceType type) {
  const size_t first = stack->size() - nargs;
  c10::DeviceGuard guard(c10::Device(type, kept.device));
  void* stream = nullptr;
  if (type == c10::kCUDA) {
    c10::impl::VirtualGuardImpl impl(type);
    stream = impl.getStream(c10::Device(type, kept.device)).native_handle();
  }
  std::vector<at::Tensor> outs;
  outs.reserve(kept.outputs.size());
  for (const auto& o : kept.outputs) {
    outs.push_back(at::empty_strided(o.sizes, o.strides, at::TensorOptions().dtype(o.dtype).device(o.device)));
  }
  std::vector<void*> pointers;
  {
    py::gil_scoped_acquire gil;
    for (const auto& launch : kept.launches) {
      pointers.clear();
      for (const auto& s : launch.buffers) {
        const at::Tensor& t = s.from == From::Arg        ? (*stack)[first + s.index].toTensor()
                              : s.from == From::Output ? outs[s.index]
                                                       : kept.constants[s.index];
        pointers.push_back(t.data_ptr());
      }
      void* handle = type == c10::kCUDA ? handle_on(kept.device, stream) : nullptr;
      void* workspace = type == c10::kCUDA ? workspace_on(kept.device, stream, launch.workspace) : nullptr;
      launch.run(reinterpret_cast<intptr_t>(pointers.data()), static_cast<int64_t>(pointers.size()),
                 reinterpret_cast<intptr_t>(workspace), reinterpret_cast<intptr_t>(handle), -1);
    }
  }
  torch::jit::drop(*stack, nargs);
  for (size_t r = 0; r < nreturns; ++r) {
    const Returned& ret = kept.returns[r];
    if (ret.list) {
      c10::List<at::Tensor> list;
      for (int32_t i : ret.outputs) list.push_back(outs[i]);
      stack->emplace_back(std::move(list));
    } else if (ret.outputs[0] < 0) {
      stack->emplace_back();
    } else {
      stack->emplace_back(outs[ret.outputs[0]]);
    }
  }
  kept.calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// ---- learning a call ------------------------------------------------------------------------------

// The kept form of a call whose Python implementation just ran, or nullptr where the replay would not be
// that call exactly. `args`: the call's tensors by position (undefined where not a tensor), their versions
// before the call.
std::shared_ptr<Kept> kept_form(const std::vector<at::Tensor>& args, const std::vector<int64_t>& versions_before,
                                py::handle launches, const std::vector<c10::IValue>& results, c10::DeviceIndex device) {
  auto kept = std::make_shared<Kept>();
  kept->device = device;
  std::unordered_map<const at::TensorImpl*, Source> known;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].defined()) continue;
    if (args[i].is_inference() || args[i]._version() != versions_before[i]) return nullptr;  // written, or unknowable
    // One tensor given twice: which position a buffer came from is ambiguous, and the next call may differ.
    if (!known.emplace(args[i].unsafeGetTensorImpl(), Source{From::Arg, static_cast<int32_t>(i)}).second) {
      return nullptr;
    }
  }
  std::vector<std::pair<at::Tensor, int64_t>> written;  // every launch buffer and its version after its launch
  for (py::handle launch : launches) {
    // (run, positions, workspace, function, buffers, inputs, outputs, versions, device)
    auto record = launch.cast<py::tuple>();
    if (record.size() != 9 || record[0].is_none()) return nullptr;  // a launch without a raw form
    if (record[8].cast<int64_t>() != device) return nullptr;
    Launch kept_launch;
    kept_launch.run = py::reinterpret_borrow<py::object>(record[0]);
    auto positions = record[1].cast<std::vector<int64_t>>();
    kept_launch.workspace = record[2].cast<int64_t>();
    kept_launch.function = record[3].cast<std::string>();
    auto buffers = record[4].cast<py::tuple>();
    const auto inputs = record[5].cast<size_t>(), outputs = record[6].cast<size_t>();
    auto versions = record[7].cast<std::vector<int64_t>>();
    std::vector<Source> sources(buffers.size());
    if (versions.size() != buffers.size()) return nullptr;
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (!THPVariable_Check(buffers[i].ptr())) return nullptr;
      at::Tensor t = THPVariable_Unpack(buffers[i].ptr());
      const at::TensorImpl* impl = t.unsafeGetTensorImpl();
      written.emplace_back(t, versions[i]);
      auto found = known.find(impl);
      if (i >= inputs && i < inputs + outputs) {  // an output this launch allocated
        if (found != known.end()) return nullptr;
        OutputSpec spec{t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.device()};
        sources[i] = Source{From::Output, static_cast<int32_t>(kept->outputs.size())};
        kept->outputs.push_back(std::move(spec));
        known.emplace(impl, sources[i]);
      } else if (found != known.end()) {
        sources[i] = found->second;
      } else if (i >= inputs + outputs) {  // the plan's constant, made once
        sources[i] = Source{From::Constant, static_cast<int32_t>(kept->constants.size())};
        kept->constants.push_back(t);
        known.emplace(impl, sources[i]);
      } else {
        return nullptr;  // a tensor the implementation made for this call: not replayable
      }
    }
    for (int64_t p : positions) {
      if (p < 0 || p >= static_cast<int64_t>(sources.size())) return nullptr;
      kept_launch.buffers.push_back(sources[p]);
    }
    kept->launches.push_back(std::move(kept_launch));
  }
  if (kept->launches.empty()) return nullptr;  // torch's function ran
  for (auto& [t, version] : written) {
    // written after its launch by something other than cuDNN, or an inference tensor (no counter: unknowable)
    if (version < 0 || t.is_inference() || t._version() != version) return nullptr;
  }
  auto output_of = [&](const at::Tensor& t) -> int32_t {
    auto found = known.find(t.unsafeGetTensorImpl());
    return found != known.end() && found->second.from == From::Output ? found->second.index : -2;
  };
  for (const auto& r : results) {
    Returned ret;
    if (r.isNone()) {
      ret.outputs.push_back(-1);
    } else if (r.isTensor()) {
      const at::Tensor& t = r.toTensor();
      int32_t i = t.defined() ? output_of(t) : -1;
      if (i == -2) return nullptr;  // a result that is not a launch's own output
      ret.outputs.push_back(i);
    } else if (r.isTensorList()) {
      ret.list = true;
      for (const at::Tensor& t : r.toTensorList().vec()) {
        int32_t i = output_of(t);
        if (i < 0) return nullptr;
        ret.outputs.push_back(i);
      }
    } else {
      return nullptr;
    }
    kept->returns.push_back(std::move(ret));
  }
  return kept;
}

void run_python(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string* key,
                c10::DeviceType type) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size(), nreturns = schema.returns().size();
  const size_t first = stack->size() - nargs;
  std::vector<at::Tensor> args(nargs);
  std::vector<int64_t> versions(nargs, 0);
  c10::DeviceIndex device = -1;
  bool on_device = false;  // a tensor of the kernel's device type among the arguments (its index: `device`)
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (v.isTensor() && v.toTensor().defined()) {
      args[i] = v.toTensor();
      // An inference tensor (torch.inference_mode) keeps no version counter: such a call is never kept.
      versions[i] = args[i].is_inference() ? -1 : args[i]._version();
      if (!on_device && args[i].device().type() == type) {
        device = args[i].device().index();
        on_device = true;
      }
    }
  }
  std::vector<c10::IValue> results;
  std::shared_ptr<Kept> kept;
  {
    py::gil_scoped_acquire gil;
    auto& impls = implementations();
    auto found = impls.by_operator.find(schema.operator_name().name);
    TORCH_CHECK(found != impls.by_operator.end(), "plancache native: no implementation of ", schema.name());
    py::tuple py_args(nargs);
    for (size_t i = 0; i < nargs; ++i) py_args[i] = torch::jit::toPyObject((*stack)[first + i]);
    const bool learning = key != nullptr && on_device;
    py::object answer = impls.learn_call(found->second, py_args, learning);
    py::object result = answer.cast<py::tuple>()[0];
    if (nreturns == 1) {
      results.push_back(torch::jit::toIValue(result, schema.returns()[0].type()));
    } else {
      auto items = result.cast<py::tuple>();
      TORCH_CHECK(items.size() == nreturns, "plancache native: ", schema.name(), " returned ", items.size(),
                  " results, its schema ", nreturns);
      for (size_t r = 0; r < nreturns; ++r) results.push_back(torch::jit::toIValue(items[r], schema.returns()[r].type()));
    }
    if (learning) {
      kept = kept_form(args, versions, answer.cast<py::tuple>()[1], results, device);
    }
  }
  if (key != nullptr) {
    std::shared_ptr<Kept> replaced;  // dropped after the lock (~Kept)
    Table& t = table();
    std::lock_guard<std::mutex> guard(t.lock);
    if (kept && t.kept.size() < MAX_KEPT) {
      replaced = std::exchange(t.kept[*key], std::move(kept));
      t.refused.erase(*key);
    } else if (!kept && t.refused.size() < MAX_KEPT) {
      t.refused[*key] += 1;
    }
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->push_back(std::move(r));
}

std::atomic<bool> g_enabled{true};

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size(), nreturns = schema.returns().size();
  const c10::DeviceType type = keys.has(c10::DispatchKey::CUDA) ? c10::kCUDA : c10::kCPU;
  std::string key;
  if (!g_enabled.load(std::memory_order_relaxed) || capturing(*stack, nargs, type) ||
      !key_of(op, *stack, nargs, &key)) {
    run_python(op, stack, nullptr, type);
    return;
  }
  std::shared_ptr<Kept> kept;
  {
    Table& t = table();
    std::lock_guard<std::mutex> guard(t.lock);
    auto found = t.kept.find(key);
    if (found != t.kept.end()) {
      kept = found->second;
    } else {
      auto refused = t.refused.find(key);
      if (refused != t.refused.end() && refused->second >= MAX_TRIES) {
        kept = nullptr;
        key.clear();
      }
    }
  }
  if (kept) {
    try {
      replay(*kept, stack, nargs, nreturns, type);
      return;
    } catch (const std::exception& e) {
      // The stack is as given until every launch has run: the Python implementation runs the call, and
      // this key stays Python's from now on.
      TORCH_WARN_ONCE("plancache native: a kept call failed (", e.what(), "); Python runs that geometry");
      Table& t = table();
      std::lock_guard<std::mutex> guard(t.lock);
      auto found = t.kept.find(key);
      if (found != t.kept.end() && found->second == kept) t.kept.erase(found);  // `kept` still holds it
      t.refused[key] = MAX_TRIES;
    }
    run_python(op, stack, nullptr, type);
    return;
  }
  run_python(op, stack, key.empty() ? nullptr : &key, type);
}

// ---- autograd in C++ ------------------------------------------------------------------------------
//
// An eager training call's autograd: what torch.library.register_autograd does in Python (an autograd.Function
// per call: ~15-25 us of Python around every call and again around its backward, GPU run 31's largest piece of
// an eager step under the mode), here in C++ for the same operators, from the same description
// (plancache.torch._ops.Gradient): keep the arguments and outputs the backward operator reads, hand it the
// incoming gradient, them and which inputs want a gradient, and route its results to the inputs. Registered for
// the Autograd key of the training operators, over Python's registration (which comes back if this one is
// removed). Identical by construction where it can be: an edge per forward argument, as autograd.Function has;
// needs taken at the forward as Function's needs_input_grad is; an undefined incoming gradient materialized as
// zeros, as Function does by default; saved tensors version-checked and released after a backward, as
// save_for_backward's are. Not supported where autograd.Function is: compiled autograd (torch._dynamo's
// compiled_autograd, off by default), forward-mode AD.

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
// torch 2.13 holds autograd nodes by c10::intrusive_ptr, earlier versions by std::shared_ptr.
using NodePointer = decltype(std::declval<Edge>().function);

enum Item : int64_t { ARGUMENT = 0, OUTPUT = 1, OUTPUTS = 2, NEEDS = 3 };  // _ops.py's

struct Gradient {
  explicit Gradient(c10::OperatorHandle b) : backward(std::move(b)) {}
  std::string name;                                   // the training operator's, for grad_fn's name
  c10::OperatorHandle backward;                       // plancache::<name>_backward
  std::vector<std::pair<int64_t, int64_t>> arguments;  // after the incoming gradient, in order
  std::vector<int64_t> of;                            // forward arguments its results are the gradients of
  std::vector<int64_t> non_differentiable;            // outputs
  std::vector<int64_t> kept_arguments;                // forward arguments read (from `arguments`)
  std::vector<int64_t> kept_outputs;                  // outputs read (OUTPUT)
  bool every_output = false;                          // OUTPUTS: every one, in order
};

struct GradientNode : public Node {
  std::shared_ptr<const Gradient> gradient;
  std::unordered_map<int64_t, SavedVariable> tensors;  // forward argument -> its tensor
  std::unordered_map<int64_t, c10::IValue> others;     // forward argument -> its value (None, scalars, lists)
  std::unordered_map<int64_t, SavedVariable> outputs;  // output -> its tensor
  std::vector<int64_t> kept_outputs;                   // their order (OUTPUTS' list)
  std::vector<bool> needs;                             // per `of`, at the forward

  explicit GradientNode(std::shared_ptr<const Gradient> g) : gradient(std::move(g)) {}

  std::string name() const override { return "plancache::" + gradient->name + "Backward"; }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> guard(mutex_);  // release_variables may run beside (a Node's contract)
    auto self = getptr();
    torch::jit::Stack stack;
    stack.reserve(gradient->arguments.size() + 1);
    stack.emplace_back(grads[0].defined() ? grads[0] : input_metadata(0).zeros_like());
    for (const auto& [kind, i] : gradient->arguments) {
      switch (kind) {
        case ARGUMENT: {
          auto t = tensors.find(i);
          if (t != tensors.end()) {
            stack.emplace_back(t->second.unpack(self));
          } else {
            stack.push_back(others.at(i));
          }
          break;
        }
        case OUTPUT:
          stack.emplace_back(outputs.at(i).unpack(self));
          break;
        case OUTPUTS: {
          c10::List<at::Tensor> list;
          for (int64_t k : kept_outputs) list.push_back(outputs.at(k).unpack(self));
          stack.emplace_back(std::move(list));
          break;
        }
        default: {
          c10::List<bool> list;
          for (bool n : needs) list.push_back(n);
          stack.emplace_back(std::move(list));
        }
      }
    }
    gradient->backward.callBoxed(stack);
    variable_list result(num_outputs());
    for (size_t j = 0; j < gradient->of.size() && j < stack.size(); ++j) {
      if (stack[j].isTensor()) result[gradient->of[j]] = stack[j].toTensor();
    }
    return result;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& [i, saved] : tensors) saved.reset_data();
    for (auto& [k, saved] : outputs) saved.reset_data();
  }
};

template <typename T>
NodePointer make_node(std::shared_ptr<const Gradient> gradient) {
  if constexpr (std::is_same_v<NodePointer, std::shared_ptr<Node>>) {
    return std::shared_ptr<T>(new T(std::move(gradient)));
  } else {
    return c10::make_intrusive<T>(std::move(gradient));
  }
}

// The Autograd key's kernel of one training operator.
struct AutogradKernel final : public c10::OperatorKernel {
  std::shared_ptr<const Gradient> gradient;

  explicit AutogradKernel(std::shared_ptr<const Gradient> g) : gradient(std::move(g)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const size_t count = op.schema().arguments().size();
    const size_t first = stack->size() - count;
    bool wanted = false;
    if (at::GradMode::is_enabled()) {
      for (size_t i = first; i < stack->size(); ++i) {
        const c10::IValue& v = (*stack)[i];
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) wanted = true;
      }
    }
    if (!wanted) {
      at::AutoDispatchBelowAutograd below;
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
      return;
    }
    std::vector<c10::IValue> arguments(stack->begin() + first, stack->end());
    torch::autograd::edge_list edges;
    edges.reserve(count);
    for (const auto& v : arguments) {
      edges.push_back(v.isTensor() && v.toTensor().defined() ? torch::autograd::impl::gradient_edge(v.toTensor())
                                                              : Edge());
    }
    {
      at::AutoDispatchBelowAutograd below;
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    }
    const size_t returns = op.schema().returns().size();
    std::vector<at::Tensor> flat;
    for (size_t r = stack->size() - returns; r < stack->size(); ++r) {
      const c10::IValue& v = (*stack)[r];
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) flat.push_back(t);
      } else {
        flat.push_back(v.isTensor() ? v.toTensor() : at::Tensor());
      }
    }
    NodePointer pointer = make_node<GradientNode>(gradient);
    auto* node = static_cast<GradientNode*>(pointer.get());
    for (int64_t j : gradient->of) node->needs.push_back(edges[j].is_valid());
    node->set_next_edges(std::move(edges));
    for (size_t k = 0; k < flat.size(); ++k) {
      const at::Tensor& t = flat[k];
      bool differentiable = t.defined() && torch::autograd::isDifferentiableType(t.scalar_type());
      for (int64_t n : gradient->non_differentiable) differentiable = differentiable && n != static_cast<int64_t>(k);
      if (differentiable) {
        uint32_t nr = node->add_input_metadata(t);
        torch::autograd::impl::set_gradient_edge(t, Edge(pointer, nr));
      } else {
        node->add_input_metadata(Node::undefined_input());
      }
    }
    for (int64_t i : gradient->kept_arguments) {
      const c10::IValue& v = arguments.at(i);
      if (v.isTensor() && v.toTensor().defined()) {
        node->tensors.emplace(i, SavedVariable(v.toTensor(), false));
      } else {
        node->others.emplace(i, v);
      }
    }
    std::vector<int64_t> keep = gradient->kept_outputs;
    if (gradient->every_output) {
      keep.clear();
      for (size_t k = 0; k < flat.size(); ++k) keep.push_back(static_cast<int64_t>(k));
    }
    for (int64_t k : keep) {
      TORCH_CHECK(k < static_cast<int64_t>(flat.size()), "plancache native: ", gradient->name, " has no output ", k);
      node->outputs.emplace(k, SavedVariable(flat[k], /*is_output=*/true));
    }
    node->kept_outputs = std::move(keep);
  }
};

// A registration that silences one warning: the dispatcher's "Overriding a previously registered kernel", which
// replacing Python's autograd registration on purpose would print.
struct Silent : public c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

std::vector<std::unique_ptr<torch::Library>>& autograd_libraries() {
  static auto* libraries = new std::vector<std::unique_ptr<torch::Library>>();
  return *libraries;
}

void install_autograd(const std::string& name, const std::string& backward,
                      const std::vector<std::pair<int64_t, int64_t>>& arguments, const std::vector<int64_t>& of,
                      const std::vector<int64_t>& non_differentiable) {
  auto handle = c10::Dispatcher::singleton().findSchema({"plancache::" + backward, ""});
  TORCH_CHECK(handle.has_value(), "plancache native: no operator plancache::", backward);
  auto gradient = std::make_shared<Gradient>(*handle);
  gradient->name = name;
  gradient->arguments = arguments;
  gradient->of = of;
  gradient->non_differentiable = non_differentiable;
  for (const auto& [kind, i] : arguments) {
    if (kind == ARGUMENT) gradient->kept_arguments.push_back(i);
    if (kind == OUTPUT) gradient->kept_outputs.push_back(i);
    if (kind == OUTPUTS) gradient->every_output = true;
  }
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "plancache", c10::DispatchKey::Autograd,
                                                   __FILE__, __LINE__);
  Silent silent;
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(gradient)));
  autograd_libraries().push_back(std::move(library));
}

// Python's registrations serve again (the dispatcher drops a library's kernels with it).
void remove_autograd() { autograd_libraries().clear(); }

// ---- Python's side --------------------------------------------------------------------------------

void install(const std::string& name, py::object implementation, const std::string& dispatch_key) {
  auto& impls = implementations();
  const std::string qualified = "plancache::" + name;
  impls.by_operator[qualified] = std::move(implementation);
  c10::DispatchKey key = c10::parseDispatchKey(dispatch_key);
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "plancache", key, __FILE__, __LINE__);
  library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
  impls.libraries.push_back(std::move(library));
}

void set_learn_call(py::object learn_call) { implementations().learn_call = std::move(learn_call); }
void set_workspace(py::object workspace) { implementations().workspace = std::move(workspace); }

bool load_cudnn(const std::string& path) {
  void* lib = dlopen(path.empty() ? "libcudnn.so.9" : path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return false;
  cudnn().create = reinterpret_cast<CudnnCreate>(dlsym(lib, "cudnnCreate"));
  cudnn().set_stream = reinterpret_cast<CudnnSetStream>(dlsym(lib, "cudnnSetStream"));
  cudnn().destroy = reinterpret_cast<CudnnDestroy>(dlsym(lib, "cudnnDestroy"));
  return cudnn().create != nullptr && cudnn().set_stream != nullptr && cudnn().destroy != nullptr;
}

void clear() {
  Table& t = table();
  std::unordered_map<std::string, std::shared_ptr<Kept>> gone;
  {
    std::lock_guard<std::mutex> guard(t.lock);
    gone.swap(t.kept);
    t.refused.clear();
    t.generation += 1;
  }
  // `gone` drops its Python objects here, with the GIL the caller holds
}

// Plans each kept call launched since the last drain, by function (a call of two plans counts two, as
// plancache.functional counts them); the counts restart.
py::dict drain_calls() {
  py::dict out;
  Table& t = table();
  std::lock_guard<std::mutex> guard(t.lock);
  for (auto& [key, kept] : t.kept) {
    int64_t n = kept->calls.exchange(0);
    if (n == 0) continue;
    for (const auto& launch : kept->launches) {
      py::str name(launch.function);
      out[name] = (out.contains(name) ? out[name].cast<int64_t>() : 0) + n;
    }
  }
  return out;
}

py::dict counts() {
  Table& t = table();
  std::lock_guard<std::mutex> guard(t.lock);
  py::dict out;
  out["kept"] = t.kept.size();
  out["refused"] = t.refused.size();
  out["generation"] = t.generation;
  out["capture_check"] = cu_stream_is_capturing() != nullptr;  // a CUDA graph's capture runs Python
  return out;
}

void set_enabled(bool enabled) { g_enabled.store(enabled); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "plancache's operators on CUDA tensors: repeated calls replayed in C++ (plancache.torch.native)";
  m.def("install", &install, py::arg("name"), py::arg("implementation"), py::arg("dispatch_key") = "CUDA");
  m.def("set_learn_call", &set_learn_call);
  m.def("set_workspace", &set_workspace);
  m.def("load_cudnn", &load_cudnn, py::arg("path") = "");
  m.def("clear", &clear);
  m.def("drain_calls", &drain_calls);
  m.def("counts", &counts);
  m.def("set_enabled", &set_enabled);
  m.def("install_autograd", &install_autograd, py::arg("name"), py::arg("backward"), py::arg("arguments"),
        py::arg("of"), py::arg("non_differentiable"));
  m.def("remove_autograd", &remove_autograd);
}
