#include "metronome/server/dashboard_assets.h"

namespace metronome::server {

const DashboardAsset* FindDashboardAsset(std::string_view path) {
  if (path == "/") path = "/dashboard/index.html";
  // A handful of files: a linear scan is as fast as any index.
  for (const DashboardAsset& a : DashboardAssets()) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

}  // namespace metronome::server
