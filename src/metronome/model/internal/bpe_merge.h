// The merge loop both BPE tokenizers run (GPT-2 byte-level ranks, SentencePiece scores): symbols
// in a doubly linked list in text order, every adjacent pair that may merge queued as a
// candidate, the best candidate merged first. A merge keeps the left symbol and unlinks the right
// one, so indices stay in text order; an entry whose symbols changed since it was queued is
// stale and skipped. What a pair merges into, what "best" means and what makes an entry stale
// belong to each tokenizer.
#pragma once

#include <cstddef>
#include <optional>
#include <queue>
#include <vector>

namespace metronome::model::internal {

inline constexpr std::size_t kNoSymbol = static_cast<std::size_t>(-1);

// Links symbols[i] to its neighbours: prev = i - 1 and next = i + 1, kNoSymbol at the ends.
template <class Symbol>
void LinkInOrder(std::vector<Symbol>& symbols) {
  for (std::size_t i = 0; i < symbols.size(); ++i) {
    symbols[i].prev = i == 0 ? kNoSymbol : i - 1;
    symbols[i].next = i + 1 == symbols.size() ? kNoSymbol : i + 1;
  }
}

// Merges best first. Symbol has prev and next; Candidate has left and right (symbol indices).
// propose(left, right) returns the candidate of that pair, or nullopt when it does not merge;
// worse(a, b) orders the queue (true: a after b); merge(c) returns false for a stale entry, else
// updates symbols[c.left] into the merged symbol (and marks symbols[c.right] dead) and returns
// true, after which the right symbol is unlinked and the left one's new pairs are proposed.
template <class Candidate, class Symbol, class Propose, class Worse, class Merge>
void MergeBestFirst(std::vector<Symbol>& symbols, Propose&& propose, Worse worse, Merge&& merge) {
  std::priority_queue<Candidate, std::vector<Candidate>, Worse> queue(worse);
  const auto try_pair = [&](std::size_t left, std::size_t right) {
    if (left == kNoSymbol || right == kNoSymbol) return;
    if (const std::optional<Candidate> c = propose(left, right)) queue.push(*c);
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) try_pair(i, i + 1);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = symbols[c.left];
    if (l.next != c.right || !merge(c)) continue;
    const std::size_t after = symbols[c.right].next;
    l.next = after;
    if (after != kNoSymbol) symbols[after].prev = c.left;
    try_pair(l.prev, c.left);
    try_pair(c.left, l.next);
  }
}

// Calls fn(symbol) for the symbols still linked, in text order.
template <class Symbol, class Fn>
void ForEachLinked(const std::vector<Symbol>& symbols, Fn&& fn) {
  for (std::size_t i = symbols.empty() ? kNoSymbol : 0; i != kNoSymbol; i = symbols[i].next) {
    fn(symbols[i]);
  }
}

}  // namespace metronome::model::internal
