// NonCopyableNonMovable: the base of an interface whose objects are used through pointers to it
// (observers, connections): copying or moving one through the interface would slice it, so
// neither is allowed. One spelling of the rule instead of four deleted members in every interface.
#pragma once

namespace metronome {

class NonCopyableNonMovable {
 public:
  NonCopyableNonMovable(const NonCopyableNonMovable&) = delete;
  NonCopyableNonMovable& operator=(const NonCopyableNonMovable&) = delete;
  NonCopyableNonMovable(NonCopyableNonMovable&&) = delete;
  NonCopyableNonMovable& operator=(NonCopyableNonMovable&&) = delete;

 protected:
  NonCopyableNonMovable() = default;
  ~NonCopyableNonMovable() = default;  // not a type to delete through: derived types are
};

}  // namespace metronome
