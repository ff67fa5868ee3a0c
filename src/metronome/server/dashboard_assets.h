// The dashboard's static files (web/dashboard/*, plus uPlot from web/node_modules when it was
// installed at build time), embedded into the binary by cmake/EmbedFiles.cmake so that
// `metronome serve` needs no files at run time. Immutable data; thread-safe.
#pragma once

#include <span>
#include <string_view>

namespace metronome::server {

struct DashboardAsset {
  std::string_view path;          // the URL path, e.g. "/dashboard/index.html"
  std::string_view content_type;  // from the file's extension
  std::string_view bytes;         // static storage
};

// Every embedded file (generated code).
[[nodiscard]] std::span<const DashboardAsset> DashboardAssets();

// The asset served at a URL path: "/" is the dashboard page; nullptr when there is none.
[[nodiscard]] const DashboardAsset* FindDashboardAsset(std::string_view path);

}  // namespace metronome::server
