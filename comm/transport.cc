#include "comm/transport.h"

namespace gz {

Transport::~Transport() = default;

void Transport::synchronize(const CallContext&) {}

}  // namespace gz
