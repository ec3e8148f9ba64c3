/* cuda_runtime.h (unmask CUDA emulator shadow): the runtime API (cuda_runtime_api.h). */
#include "cuda_runtime_api.h"
