// `corelm data build` (include/corelm/corpus_build.h): paragraph splitting and normalisation, each
// quality rule, exact and near duplicates, the train/val split, determinism over thread counts,
// token files that TokenDataset::open loads and that decode to the kept text, and failed builds
// that leave no partial output.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "common/cli_runner.h"
#include "common/gzip.h"
#include "corelm/corpus_build.h"
#include "corelm/error.h"
#include "corelm/thread_pool.h"
#include "corelm/tokenizer.h"
#include "corelm/train.h"

namespace corelm::testing {
namespace {
namespace fs = std::filesystem;
using pipeline::CorpusBuildOptions;
using pipeline::CorpusBuildReport;

const std::vector<std::string> kWords = {
    "the",     "of",      "and",     "to",      "a",       "in",      "is",     "that",    "river",   "mountain",
    "village", "winter",  "morning", "garden",  "teacher", "window",  "letter", "journey", "kitchen", "harvest",
    "quietly", "slowly",  "bright",  "heavy",   "ancient", "gentle",  "walked", "carried", "watched", "opened",
    "remembered", "found", "across", "beneath", "toward",  "between", "stone",  "bridge",  "candle",  "market",
    "soldier", "farmer",  "music",   "silence", "summer",  "forest",  "shadow", "evening", "promise", "stranger",
    "with",    "for",     "was",     "on",      "by",      "from",    "they",   "her",     "his",     "their"};

// An English-looking paragraph of `words` words in sentences of 8-12 words, from `seed`.
std::string prose(uint32_t seed, int words = 60) {
  std::mt19937 rng(seed);
  std::string out;
  int in_sentence = 0, sentence_len = 8 + static_cast<int>(rng() % 5);
  for (int i = 0; i < words; ++i) {
    std::string w = kWords[rng() % kWords.size()];
    if (in_sentence == 0) w[0] = static_cast<char>(w[0] - 32);
    if (!out.empty()) out += ' ';
    out += w;
    if (++in_sentence == sentence_len || i + 1 == words) {
      out += '.';
      in_sentence = 0;
      sentence_len = 8 + static_cast<int>(rng() % 5);
    }
  }
  return out;
}

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_file(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}
std::string zstd(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3));
  return out;
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<std::string> lines_of(const std::string& s) { return pipeline::normalized_lines(s); }
std::string verdict(const std::string& s) { return pipeline::quality_verdict(lines_of(s), {}); }

// ---- pieces ----

TEST(CorpusFilters, SplitsParagraphsOnBlankLinesAcrossFeeds) {
  std::vector<std::string> got;
  pipeline::ParagraphSplitter sp(1 << 16, [&](std::string&& p) { got.push_back(p); });
  const std::string text = "one\r\ntwo\n\n \t \nthree\n\n\n\nfour";
  for (char c : text) sp.feed(std::string_view(&c, 1));  // byte by byte: a line may span feeds
  sp.finish();
  EXPECT_EQ(got, (std::vector<std::string>{"one\ntwo", "three", "four"}));
}

TEST(CorpusFilters, CutsParagraphsAndLinesAtTheByteLimit) {
  std::vector<std::string> got;
  pipeline::ParagraphSplitter sp(300, [&](std::string&& p) { got.push_back(p); });
  std::string line;
  for (int i = 0; i < 200; ++i) line += "word ";
  sp.feed(line);  // 1000 bytes, no newline
  sp.feed("\nshort line\n");
  sp.finish();
  ASSERT_GE(got.size(), 4u);
  std::string joined;
  for (const auto& p : got) {
    EXPECT_LE(p.size(), 300u);
    joined += p;
  }
  EXPECT_NE(joined.find("short line"), std::string::npos);
  EXPECT_EQ(std::count(joined.begin(), joined.end(), 'w'), 200);  // nothing lost
}

TEST(CorpusFilters, NormalisesWhitespaceAndJoinsLines) {
  const auto lines = lines_of("  The\tquick \x08 brown\f fox  \n\n   jumps   over  ");
  EXPECT_EQ(lines, (std::vector<std::string>{"The quick brown fox", "jumps over"}));
  EXPECT_EQ(pipeline::join_lines(lines, false), "The quick brown fox jumps over");
  EXPECT_EQ(pipeline::join_lines(lines, true), "The quick brown fox\njumps over");
}

TEST(CorpusFilters, EachQualityRuleDropsItsCaseAndKeepsProse) {
  EXPECT_EQ(verdict(prose(1)), "");
  EXPECT_EQ(verdict("It was the best of times, it was the worst of times, it was the age of wisdom, it was the\n"
                    "age of foolishness, it was the epoch of belief.\n"),
            "");
  // numbers and tables: few letters
  EXPECT_EQ(verdict("2019 3.14 2.71 1.41 1.73 2020 0.57 1.61 4.66 9.81 6.02 8.31 1.38 6.67 2.99 and 1.60."), "letters");
  // markup and code: symbols
  EXPECT_EQ(verdict("The value of {x} is <b>set</b> by the #define and the $var in the @list with a ~tilde and "
                    "the *star* in {the} [end] of {it}."),
            "symbols");
  // runs of long tokens (hashes, base64)
  EXPECT_EQ(verdict("The aGVsbG93b3JsZGhlbGxvd29ybGQ is the c2Vjb25kdmFsdWVzZWNvbmR2YWx1ZQ and "
                    "dGhpcmR0aGluZ3RoaXJkdGhpbmd0aGlyZA of Zm91cnRoZm91cnRoZm91cnRoZm91cnRo."),
            "word_length");
  // another language: few English stopwords
  EXPECT_EQ(verdict("Der schnelle braune Fuchs springt über den faulen Hund, und die Katze schläft auf dem "
                    "warmen Sofa neben der Heizung, während draußen der Regen fällt und niemand kommt."),
            "stopwords");
  EXPECT_EQ(verdict("Le renard brun rapide saute par-dessus le chien paresseux, et le chat dort sur le canapé "
                    "chaud près du radiateur pendant que la pluie tombe dehors."),
            "stopwords");
  // a menu: lines that neither end nor continue a sentence
  EXPECT_EQ(verdict("File Open and the Save of the Document\nEdit Copy and the Paste of the Text\n"
                    "View the Zoom In and the Zoom Out\nHelp is the About of the Program.\n"),
            "line_ends");
  EXPECT_EQ(verdict("the is a list of the words with no sentence end in it at all for the rule to see"), "line_ends");
  // the same line over and over
  EXPECT_EQ(verdict("This is the line that repeats.\nThis is the line that repeats.\nThis is the line that repeats.\n"
                    "This is the line that repeats.\nAnd this is the one that does not.\n"),
            "repeated_lines");
}

TEST(CorpusFilters, OneChangedWordIsANearDuplicateAndAnotherParagraphIsNot) {
  const std::string a = prose(7, 60);
  std::string b = a;
  const size_t at = b.find(' ', b.size() / 2);
  b.insert(at, " zebra");  // one word changed: inserted, then the next one removed
  const size_t next = b.find(' ', at + 6);
  b.erase(at + 6, b.find(' ', next + 1) - at - 6);
  const double j = pipeline::jaccard(pipeline::shingles(a), pipeline::shingles(b));
  EXPECT_GE(j, 0.8);
  EXPECT_LT(j, 1.0);
  EXPECT_LT(pipeline::jaccard(pipeline::shingles(a), pipeline::shingles(prose(8, 60))), 0.1);
  EXPECT_EQ(pipeline::shingles("Hello, WORLD!"), pipeline::shingles("hello world"));  // words, not punctuation
}

// ---- builds ----

class CorpusBuildTest : public ::testing::Test {
 protected:
  ScratchDir dir_{"corpus_build"};
  CorpusBuildOptions options(const std::vector<std::string>& inputs) const {
    CorpusBuildOptions o;
    o.inputs = inputs;
    o.output = dir_ / "corpus.bin";
    o.vocab_size = 300;
    o.val_fraction = 0.2;
    return o;
  }
  void TearDown() override { set_num_threads(1); }
};

// The paragraphs of a token file, decoded ("\n\n" after each).
std::vector<std::string> decoded_paragraphs(const std::string& bin, const Tokenizer& tok) {
  const train::TokenDataset d = train::TokenDataset::open(bin);
  std::vector<TokenId> ids;
  for (int64_t i = 0; i < d.size(); ++i) ids.push_back(d[i]);
  const std::string text = tok.decode(ids);
  std::vector<std::string> paras;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "every paragraph ends with a blank line";
    if (end == std::string::npos) break;
    paras.push_back(text.substr(pos, end - pos));
    pos = end + 2;
  }
  return paras;
}

TEST_F(CorpusBuildTest, DropsDuplicatesAndLowQualityAndDecodesToTheKeptText) {
  std::vector<std::string> kept;
  std::string text;
  for (uint32_t s = 1; s <= 30; ++s) {
    kept.push_back(prose(s));
    text += kept.back() + "\n\n";
  }
  std::string near = kept[3];
  near.replace(near.find(' ', 100) + 1, 0, "zebra ");  // one word inserted into a 60-word paragraph
  near.erase(near.find("zebra ") + 6, near.find(' ', near.find("zebra ") + 6) + 1 - near.find("zebra ") - 6);
  text += kept[5] + "\n\n";                             // exact duplicate
  text += "  " + kept[6] + "  \n\n";                    // the same after whitespace normalisation
  text += near + "\n\n";                                // near duplicate
  text += "short.\n\n";                                 // too short
  text += "2019 3.14 2.71 1.41 1.73 2020 0.57 1.61 4.66 9.81 6.02 8.31 1.38 6.67 2.99 and 1.60 then.\n\n";
  text += "Der schnelle braune Fuchs springt über den faulen Hund, und die Katze schläft auf dem warmen Sofa.\n\n";
  text += std::string("Bad \xff\xfe bytes in the middle of a paragraph that is otherwise long enough to keep.\n\n");
  write_file(dir_ / "a.txt", text);
  const CorpusBuildReport r = pipeline::build_corpus(options({dir_ / "a.txt"}));
  EXPECT_EQ(r.paragraphs_in, 37);
  EXPECT_EQ(r.paragraphs_kept, 30);
  EXPECT_EQ(r.dropped.at("exact_duplicate"), 2);
  EXPECT_EQ(r.dropped.at("near_duplicate"), 1);
  EXPECT_EQ(r.dropped.at("too_short"), 1);
  EXPECT_EQ(r.dropped.at("letters"), 1);
  EXPECT_EQ(r.dropped.at("stopwords"), 1);
  EXPECT_EQ(r.dropped.at("invalid_utf8"), 1);
  EXPECT_GT(r.paragraphs_val, 0);
  EXPECT_EQ(r.paragraphs_train + r.paragraphs_val, 30);
  ASSERT_TRUE(r.tokenizer_trained);
  EXPECT_EQ(r.tokenizer, dir_ / "corpus.tokenizer.json");
  EXPECT_EQ(r.val_output, dir_ / "corpus.val.bin");

  auto tok = Tokenizer::load(r.tokenizer);
  const auto train_p = decoded_paragraphs(r.output, *tok);
  const auto val_p = decoded_paragraphs(r.val_output, *tok);
  EXPECT_EQ(static_cast<int64_t>(train_p.size()), r.paragraphs_train);
  EXPECT_EQ(static_cast<int64_t>(val_p.size()), r.paragraphs_val);
  // Train keeps input order; together with val it is exactly the kept set; the two are disjoint.
  std::vector<std::string> expected_train;
  std::set<std::string> val_set(val_p.begin(), val_p.end());
  for (const auto& p : kept)
    if (!val_set.count(p)) expected_train.push_back(p);
  EXPECT_EQ(train_p, expected_train);
  std::set<std::string> all(train_p.begin(), train_p.end());
  for (const auto& p : val_p) EXPECT_TRUE(all.insert(p).second) << "in both splits: " << p;
  EXPECT_EQ(all, std::set<std::string>(kept.begin(), kept.end()));
  EXPECT_EQ(static_cast<uint64_t>(train::TokenDataset::open(r.output).size()), r.train_tokens);
  EXPECT_EQ(static_cast<uint64_t>(train::TokenDataset::open(r.val_output).size()), r.val_tokens);
  // `corelm train --data corpus.bin corpus.val.bin --val-fraction F` validates on exactly val.
  const double total = static_cast<double>(r.train_tokens + r.val_tokens);
  EXPECT_EQ(static_cast<uint64_t>(total * r.train_val_fraction()), r.val_tokens);
  // The sidecar is the `corelm tokenize` one plus the report.
  const auto meta = nlohmann::json::parse(read_file(r.output + ".json"));
  EXPECT_EQ(meta["dtype"], "uint16");
  EXPECT_EQ(meta["tokens"], r.train_tokens);
  EXPECT_EQ(meta["split"], "train");
  EXPECT_EQ(meta["data_build"]["dropped"]["near_duplicate"], 1);
  EXPECT_EQ(meta["tokenizer"].get<std::string>().find(".tmp."), std::string::npos) << meta["tokenizer"];
}

TEST_F(CorpusBuildTest, ReadsFoldersRecursivelyWithGzipAndZstdAndSkipsBinaryFiles) {
  fs::create_directories(dir_ / "in/b/c");
  write_file(dir_ / "in/b/c/z.txt.zst", zstd(prose(1) + "\n\n" + prose(2) + "\n"));
  write_file(dir_ / "in/a.txt.gz", gzip(prose(3) + "\n\n" + prose(4)));
  write_file(dir_ / "in/b/plain.txt", prose(5));
  write_file(dir_ / "in/b/image.png", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16) + prose(6));
  write_file(dir_ / "in/empty.txt", "");
  CorpusBuildOptions o = options({dir_ / "in"});
  o.val_fraction = 0;
  const CorpusBuildReport r = pipeline::build_corpus(o);
  EXPECT_EQ(r.files, 4);
  EXPECT_EQ(r.files_skipped_binary, 1);
  EXPECT_EQ(r.files_empty, 1);
  EXPECT_EQ(r.paragraphs_kept, 5);
  EXPECT_TRUE(r.val_output.empty());
  EXPECT_FALSE(fs::exists(dir_ / "corpus.val.bin"));
  auto tok = Tokenizer::load(r.tokenizer);
  // Sorted path order: in/a.txt.gz, in/b/c/z.txt.zst, in/b/plain.txt.
  EXPECT_EQ(decoded_paragraphs(r.output, *tok), (std::vector<std::string>{prose(3), prose(4), prose(1), prose(2), prose(5)}));
}

TEST_F(CorpusBuildTest, SameInputsGiveIdenticalBytesForAnyThreadCount) {
  std::string text;
  for (uint32_t s = 1; s <= 200; ++s) text += prose(s, 40 + s % 50) + "\n\n" + (s % 7 == 0 ? prose(s - 3, 40 + (s - 3) % 50) + "\n\n" : "");
  write_file(dir_ / "a.txt", text);
  std::vector<std::string> bytes[2];
  for (int run = 0; run < 2; ++run) {
    set_num_threads(run == 0 ? 1 : 3);
    CorpusBuildOptions o = options({dir_ / "a.txt"});
    o.output = dir_ / ("run" + std::to_string(run) + ".bin");
    const CorpusBuildReport r = pipeline::build_corpus(o);
    EXPECT_EQ(r.dropped.at("exact_duplicate"), 28);
    for (const std::string& f : {r.output, r.val_output, r.tokenizer}) bytes[run].push_back(read_file(f));
    auto meta = nlohmann::json::parse(read_file(r.output + ".json"));
    bytes[run].push_back(std::to_string(meta["tokens"].get<int64_t>()));
  }
  ASSERT_EQ(bytes[0].size(), bytes[1].size());
  for (size_t i = 0; i < bytes[0].size(); ++i) {
    EXPECT_FALSE(bytes[0][i].empty());
    EXPECT_TRUE(bytes[0][i] == bytes[1][i]) << "file " << i << " differs between 1 and 3 threads";
  }
}

TEST_F(CorpusBuildTest, AGivenTokenizerIsUsedAsIs) {
  write_file(dir_ / "a.txt", prose(1) + "\n\n" + prose(2) + "\n\n" + prose(3));
  CorpusBuildOptions o = options({dir_ / "a.txt"});
  const CorpusBuildReport first = pipeline::build_corpus(o);
  o.tokenizer = first.tokenizer;
  o.output = dir_ / "again.bin";
  const CorpusBuildReport second = pipeline::build_corpus(o);
  EXPECT_FALSE(second.tokenizer_trained);
  EXPECT_FALSE(fs::exists(dir_ / "again.tokenizer.json"));
  EXPECT_EQ(read_file(first.output), read_file(second.output));
}

// Every file in the folder, for checking that nothing (temp files included) was left behind.
std::set<std::string> listing(const fs::path& d) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.insert(e.path().filename().string());
  return names;
}

TEST_F(CorpusBuildTest, AFailedBuildLeavesNoPartialOutput) {
  write_file(dir_ / "a.txt", prose(1) + "\n\n" + prose(2));
  std::string gz = gzip(prose(3) + "\n\n" + prose(4) + "\n\n" + prose(5));
  gz[gz.size() / 2] = static_cast<char>(gz[gz.size() / 2] ^ 0x55);
  gz[gz.size() / 2 + 1] = static_cast<char>(gz[gz.size() / 2 + 1] ^ 0x55);
  write_file(dir_ / "b.txt.gz", gz);
  const auto before = listing(dir_.path());
  std::string err;
  try {
    pipeline::build_corpus(options({dir_ / "a.txt", dir_ / "b.txt.gz"}));
  } catch (const FormatError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find(dir_ / "b.txt.gz"), std::string::npos) << err;
  EXPECT_NE(err.find("byte"), std::string::npos) << err;
  EXPECT_EQ(listing(dir_.path()), before);  // no corpus.bin, no temp or spill files

  // With an earlier build in place, a failed one leaves it untouched.
  const CorpusBuildReport good = pipeline::build_corpus(options({dir_ / "a.txt"}));
  const std::string old_bin = read_file(good.output), old_meta = read_file(good.output + ".json");
  const auto with_build = listing(dir_.path());
  EXPECT_THROW(pipeline::build_corpus(options({dir_ / "a.txt", dir_ / "b.txt.gz"})), FormatError);
  EXPECT_EQ(read_file(good.output), old_bin);
  EXPECT_EQ(read_file(good.output + ".json"), old_meta);
  EXPECT_EQ(listing(dir_.path()), with_build);
}

TEST_F(CorpusBuildTest, TempFilesOfAKilledBuildAreRemovedByTheNext) {
  write_file(dir_ / "a.txt", prose(1) + "\n\n" + prose(2));
  // pid 2^22 + 1 is above Linux's pid_max limit, so never a live process; ours is alive.
  const std::string dead = std::to_string((1 << 22) + 1), alive = std::to_string(::getpid());
  const std::vector<std::string> litter{"corpus.bin.tmp." + dead + ".0", "corpus.val.bin.json.tmp." + dead + ".3",
                                        ".corpus.bin.bpe-sample." + dead + ".1.txt",
                                        ".corpus.tokenizer.json.tmp." + dead + ".2.json"};
  for (const auto& n : litter) write_file(dir_ / n, "x");
  write_file(dir_ / ("corpus.bin.tmp." + alive + ".99"), "x");  // a live writer's: kept
  write_file(dir_ / ("other.bin.tmp." + dead + ".0"), "x");      // another output's: not ours to remove
  pipeline::build_corpus(options({dir_ / "a.txt"}));
  for (const auto& n : litter) EXPECT_FALSE(fs::exists(dir_ / n)) << n;
  EXPECT_TRUE(fs::exists(dir_ / ("corpus.bin.tmp." + alive + ".99")));
  EXPECT_TRUE(fs::exists(dir_ / ("other.bin.tmp." + dead + ".0")));
}

TEST_F(CorpusBuildTest, BadInputsAndOptionsAreClearErrors) {
  write_file(dir_ / "a.txt", prose(1) + "\n\n" + prose(2));
  auto build = [&](CorpusBuildOptions o) { return error_of([&] { pipeline::build_corpus(o); }); };
  EXPECT_NE(build(options({dir_ / "missing.txt"})).find("missing.txt: No such file"), std::string::npos);
  write_file(dir_ / "empty.txt", "");
  EXPECT_NE(build(options({dir_ / "empty.txt"})).find("hold no text"), std::string::npos);
  fs::create_directories(dir_ / "nothing");
  EXPECT_NE(build(options({dir_ / "nothing"})).find("hold no text"), std::string::npos);
  write_file(dir_ / "junk.txt", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32\n");
  EXPECT_NE(build(options({dir_ / "junk.txt"})).find("was dropped by the filters"), std::string::npos);
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  EXPECT_NE(build(options({dir_ / "fifo"})).find("not a regular file"), std::string::npos);
  EXPECT_NE(build(options({dir_ / "a.txt", dir_ / "a.txt"})).find("given twice"), std::string::npos);
  for (double v : {-0.1, 0.51, 1.0, std::nan("")}) {
    CorpusBuildOptions o = options({dir_ / "a.txt"});
    o.val_fraction = v;
    EXPECT_NE(build(o).find("--val-fraction must be in [0, 0.5]"), std::string::npos) << v;
  }
  CorpusBuildOptions o = options({dir_ / "a.txt"});
  o.quality.min_letter_ratio = 1.5;
  EXPECT_NE(build(o).find("--min-letter-ratio"), std::string::npos);
  o = options({dir_ / "a.txt"});
  o.vocab_size = 10;
  EXPECT_NE(build(o).find("--vocab-size"), std::string::npos);
  o = options({dir_ / "a.txt"});
  o.output = dir_ / "no/such/folder/corpus.bin";
  EXPECT_NE(build(o).find("does not exist"), std::string::npos);
  o = options({dir_ / "a.txt"});
  o.tokenizer = dir_ / "no_tokenizer.json";
  EXPECT_NE(build(o).find("no_tokenizer.json"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "corpus.bin"));
}

}  // namespace
}  // namespace corelm::testing
