#include "parallel/dp/units_in_use.h"

#include "core/check.h"

namespace meshtrain::parallel {

UnitsInUse::UnitsInUse(int units, Start start, Free free)
    : units_(units), start_(std::move(start)), free_(std::move(free)) {}

UnitsInUse::~UnitsInUse() {
  for (auto& u : units_)
    if (u && u->request) u->request->wait();  // a gather in flight writes into its buffer
}

UnitsInUse::Unit& UnitsInUse::start(int u) {
  if (!units_[u]) {
    auto unit = std::make_unique<Unit>();
    start_(u, *unit);
    units_[u] = std::move(unit);
  }
  return *units_[u];
}

UnitsInUse::Unit& UnitsInUse::acquire(int u) {
  Unit& unit = start(u);
  if (unit.request) unit.request->wait();
  unit.users++;
  return unit;
}

void UnitsInUse::release(int u, Stay stay) {
  CHECK_MSG(units_[u] && units_[u]->users > 0, "a unit released more often than acquired");
  Unit& unit = *units_[u];
  if (--unit.users > 0 || stay == Stay::kKeep) return;
  if (stay == Stay::kHold) {
    unit.held = true;
    return;
  }
  drop(u);
}

void UnitsInUse::drop_idle(bool every) {
  for (size_t u = 0; u < units_.size(); u++)
    if (units_[u] && units_[u]->users == 0 && (every || units_[u]->held)) drop((int)u);
}

int UnitsInUse::started() const {
  int n = 0;
  for (const auto& u : units_) n += u != nullptr;
  return n;
}

void UnitsInUse::drop(int u) {
  Unit& unit = *units_[u];
  if (unit.request) unit.request->wait();  // a prefetch never used
  free_(unit);
  units_[u].reset();
}

}  // namespace meshtrain::parallel
