// Command go-edge prints, one JSON object per line, what Go's standard library and
// apimachinery answer for the edge cases that kpulse's `go` module reproduces. Its output is
// aggregator-api/testdata/go-edge/golden.jsonl; `cargo xtask go-golden` regenerates it and
// `cargo xtask go-golden --check` compares it, and the unit test
// `go::tests::matches_output_captured_from_go` checks kpulse against every line.
//
// Each line has "fn" (which function), the input as "in" (text) or "in_hex" (bytes, for
// input that is not UTF-8), and either "out" / "out_hex" (the result) or "err" (the error's
// text).
package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

type line struct {
	Fn     string `json:"fn"`
	In     string `json:"in,omitempty"`
	InHex  string `json:"in_hex,omitempty"`
	Out    string `json:"out,omitempty"`
	OutHex string `json:"out_hex,omitempty"`
	Err    string `json:"err,omitempty"`
	// Ok is set when the function succeeded, so that an empty "out" is still told apart
	// from an error.
	Ok bool `json:"ok"`
}

var w = bufio.NewWriter(os.Stdout)

func emit(l line) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(l); err != nil {
		fmt.Fprintln(os.Stderr, "go-edge:", err)
		os.Exit(1)
	}
	w.WriteString(b.String())
}

// in fills In, or InHex when the input is not valid UTF-8 (JSON cannot carry it).
func in(l *line, s string) {
	if isUTF8(s) {
		l.In = s
	} else {
		l.InHex = hex.EncodeToString([]byte(s))
	}
}

func isUTF8(s string) bool {
	return utf8.ValidString(s)
}

func result(l *line, out string, err error) {
	if err != nil {
		l.Err = err.Error()
		return
	}
	l.Ok = true
	if isUTF8(out) {
		l.Out = out
	} else {
		l.OutHex = hex.EncodeToString([]byte(out))
	}
}

func quoteCases() []string {
	cases := []string{
		"", "plain", "ns/name", "q\"b\\", "it's", "`back`",
		" ", "~", "\x7f", "\x00", "\x1b", "\x1f",
		"\a\b\f\n\r\t\v",
		"µs héllo 世界", "😀", "👍🏽", "e\u0301", "\u0301",
		"\u00a0", "\u00ad", "\u0085", "\u0080", "\u009f", "\u1680", "\u180e",
		"\u2000", "\u200b", "\u200d", "\u2028", "\u2029", "\u202f", "\u205f", "\u2060",
		"\u3000", "\ufeff", "\ufff9", "\ufffc", "\ufffd", "\ufffe", "\uffff",
		"\u0378", "\u0379", "\u0380", "\u0600", "\u061c", "\u06dd", "\u070f", "\u08e2",
		"\u0890", "\u0897", "\u0d04", "\u1fff",
		"\ue000", "\uf8ff", "\U000f0000", "\U0010fffd", "\U0010ffff", "\U0001fffe",
		"\U0001d173", "\U000e0001", "\U000e0020", "\U000e0100", "\U000e01ef", "\U000e01f0",
		"\U000110bd", "\U000110cd", "\U00013430", "\U0001343f", "\U0001bca0",
		"\U00030000", "\U000323af", "\U000323b0", "\U00031350", "\U0002ebe0", "\U0002ebf0",
		"\U0001f6d8", "\U0001f6dc", "\U0001fae9", "\U0001fa7d", "\U00011f00", "\U0001e4d0",
		"\U0001e030", "\U0001f7d9", "\U0001fbca", "\u0cf3", "\u0ecf", "\U0001123f",
		"\U0002b739", "\U0002b73a",
		"\U0001f1e6\U0001f1e8", "a\u034fb", "\u115f", "\u3164", "\uffa0",
		"\ufe00", "\ufe0f", "\u2061", "\u2064", "\u2065", "\u206a",
		"\U0001d455", "\U0001d456", "\U000e0080",
		"\xff", "\xc3", "a\xe2\x82b", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf",
		"\xf0\x9f\x98", "abc\x80def",
	}
	return cases
}

func parseIntCases() []string {
	return []string{
		"0", "1", "-1", "+1", "007", "-0", "+0",
		"9223372036854775807", "-9223372036854775808",
		"9223372036854775808", "-9223372036854775809",
		"18446744073709551615", "18446744073709551616", "99999999999999999999",
		"99999999999999999999x", "x99999999999999999999",
		"", "-", "+", "+-1", "--1", "1_000", " 1", "1 ", "0x10", "1e3", "1.0",
		"١", "12a", "a", "é", "\x00", "\xff",
	}
}

func durationCases() []string {
	return []string{
		"0", "+0", "-0", "", "-", "+", "0s", "1s", "-1s", "+1s", "1.5h", ".5s", "5.s", ".s",
		"1h2m3.4s", "1h2m3s4ms5us6ns", "1ns", "1us", "1µs", "1μs", "1ms", "1m", "1h",
		"1m30s", "90s", "10s", "500ms", "250ms", "2h45m", "1.0000000001s", "1.00000000001s",
		"0.000000001s", "0.0000000001s", "3.000000001ms", "100000h",
		"2562047h47m16.854775807s", "2562047h47m16.854775808s",
		"-2562047h47m16.854775808s", "-2562047h47m16.854775809s",
		"9223372036854775807ns", "9223372036854775808ns", "-9223372036854775808ns",
		"-9223372036854775809ns", "9223372036854775807.9ns", "9223372036854775808.0ns",
		"99999999999999999999h", "2562048h", "1.9999999999999999999999999999s",
		"0.9223372036854775807s", "0.92233720368547758089s",
		"1", "10", "1.5", "s", "h", "1d", "1x", "1S", "1Ms", "1.5.5h", "1..5s",
		"é", "1h\x01", "1 s", " 1s", "1s ", "1sm", "1mss", "1µ", "1u", "1hh",
		"1e3s", "0x1s", "1_0s", "\xff", "1\xffs",
	}
}

func formatDurationCases() []int64 {
	return []int64{
		0, 1, 999, 1000, 1001, 1100, 1500, 999999, 1000000, 2200000, 500000000,
		999999999, 1000000000, 1000000001, 3300000000, 15000000000, 20051000000,
		20051000001, 59999999999, 60000000000, 60500000000, 245000000000, 245001000000,
		3599999999999, 3600000000000, 3723000000000, 18367001000000, 28801000000000,
		86400000000000, 360000000000000,
		-1, -999, -1000, -1500, -1000000, -1000000000, -60000000000, -3600000000000,
		-3723004005006,
		math.MaxInt64, math.MinInt64, math.MinInt64 + 1, math.MaxInt64 - 1,
	}
}

func unescapeCases() []string {
	return []string{
		"", "plain", "a%20b", "a+b", "%2B", "%2b", "a%2Fb", "%41%42", "%e4%b8%96",
		"%ff", "%FF%fe", "%", "a%", "a%2", "%zz", "%2z", "%z2", "%%", "%%41", "%00",
		"100%", "a b", "a%20%2", "%C3%A9", "é", "a?b", "a#b", "a;b", "+", "++%2B",
		"%e2%82", "%2", "a%g0",
	}
}

func escapedPathCases() []string {
	return []string{
		"/", "/apis/metrics.k8s.io/v1beta1/nodes", "/a%2Fb", "/a%2fb", "/a%62",
		"/a\"b", "/a%22b", "/a b", "/a%20b", "/a{b}", "/a%7Bb%7D", "/a|b", "/a^b", "/a`b",
		"/a<b>", "/a\\b", "/a%5Cb", "/é", "/%C3%A9", "/%ff", "/%ff\"", "/a!b", "/a'b",
		"/a(b)", "/a*b", "/a[b]", "/a$b", "/a&b", "/a+b", "/a,b", "/a:b", "/a;b", "/a=b",
		"/a@b", "/a~b", "/a_b-c.d", "/a#b", "/a%23b", "/a%3Fb", "/a%3Fb\"",
		"/api/v1/watch", "/apis/metrics.k8s.io/v1beta1/watch\"", "/a%25b", "/a%25b\"",
		"//a", "/a/../b", "/a/./b",
	}
}

func boolCases() []string {
	return []string{
		"", "true", "false", "0", "1", "False", "FALSE", "fAlSe", "yes", "no", "t", "f",
		"off", " false", "false ", "00", "-0", "ſalse", "faſe", "falſe", "fal\u017fe",
		"\u212aalse",
	}
}

func labelCases() []string {
	long := strings.Repeat("x", 63)
	return []string{
		"", " ", "a", "a=b", "a==b", "a!=b", "!a", "! a", "a,b", "a=b,c=d", "c=d,a=b",
		"a=", "a==", "a!=", "a=b,", ",a", "a,,b", "a in (b,c)", "a in (c,b,b)",
		"a notin (b,c)", "a in ()", "a in (,)", "a in (b,)", "a in (,b)", "a in (b,,c)",
		"a in b", "a in (b", "a in (b c)", "a in", "a notin", "a in (in)", "in in (in)",
		"a>1", "a<1", "a>-1", "a>x", "a<1.5", "a>", "a>1,b<2", "a>99999999999999999999",
		"a gt 1", "a=b=c", "a=(b)", "a b", "a=b c", "!a=b", "!!a", "!a,!b", "a!", "a!b",
		"=a", "==", "!=", "(", ")", "a)", "a=)", "a=,b",
		"-a=b", "a-=b", "a_b=c", "a.b=c", "A=B", "1=2", "a/b=c", "a.com/b=c", "A.com/b=c",
		"/b=c", "a/=c", "a/b/c=d", "-a.com/b=c", "a..com/b=c",
		long + "=v", long + "x=v", "k=" + long, "k=" + long + "x",
		strings.Repeat("p", 254) + "/n=v", strings.Repeat("p", 253) + "/n=v",
		strings.Repeat("p", 254) + "/" + long + "x=v",
		"k=-v", "k=v-", "k=v_w.x", "k=v/w", "k=é", "é=v", "k in (-v)", "k in (a,-v,-w)",
		"k notin (" + long + "x)", "k>1x", "k in (a b)", "a\tin\t(b)", "a\n=\nb",
		"a=b\x00c=d", "x,y in (a),!z,w=v,u!=t,s==r", "a=b,a=c", "b=1,a=2,b=0",
		"a in (b),a=c",
	}
}

func fieldCases() []string {
	return []string{
		"", "a=b", "a==b", "a!=b", "metadata.name=x", "metadata.name==x,metadata.namespace!=y",
		"b=1,a=2", "a", "a,b=c", ",", "a=b,", ",a=b", "=b", "a=", "=", "==", "!=",
		"a=b=c", "a=b\\=c", "a=b\\,c", "a=b\\\\c", "a=b\\c", "a=b\\", "a=b,c",
		"a\\,b=c", "a\\=b=c", "a=\\", "a=\\\\", "a=b\\,c,d=e", "a=b,c=d\\", "a=é",
		"x!=y==z", "x==y!=z", "x=!y", "x!y", "a=,b=", "a=b,,c=d", "a = b", " a=b",
		"a=b,a=c", "a=b\\,", "a=b\\,\\",
	}
}

func main() {
	for _, s := range quoteCases() {
		l := line{Fn: "quote"}
		in(&l, s)
		result(&l, strconv.Quote(s), nil)
		emit(l)
	}
	for _, s := range parseIntCases() {
		l := line{Fn: "parse_int"}
		in(&l, s)
		n, err := strconv.ParseInt(s, 10, 64)
		result(&l, strconv.FormatInt(n, 10), err)
		emit(l)
	}
	for _, s := range durationCases() {
		l := line{Fn: "parse_duration"}
		in(&l, s)
		d, err := time.ParseDuration(s)
		result(&l, strconv.FormatInt(int64(d), 10), err)
		emit(l)
	}
	for _, n := range formatDurationCases() {
		l := line{Fn: "format_duration", In: strconv.FormatInt(n, 10)}
		result(&l, time.Duration(n).String(), nil)
		emit(l)
	}
	for _, s := range unescapeCases() {
		l := line{Fn: "path_unescape"}
		in(&l, s)
		out, err := url.PathUnescape(s)
		result(&l, out, err)
		emit(l)
		l = line{Fn: "query_unescape"}
		in(&l, s)
		out, err = url.QueryUnescape(s)
		result(&l, out, err)
		emit(l)
	}
	for _, s := range escapedPathCases() {
		l := line{Fn: "escaped_path"}
		in(&l, s)
		u, err := url.ParseRequestURI(s)
		if err != nil {
			result(&l, "", err)
		} else {
			result(&l, u.EscapedPath(), nil)
		}
		emit(l)
	}
	for _, s := range boolCases() {
		l := line{Fn: "convert_bool", In: s}
		var out bool
		in := []string{s}
		err := runtime.Convert_Slice_string_To_bool(&in, &out, nil)
		result(&l, strconv.FormatBool(out), err)
		emit(l)
	}
	for _, s := range labelCases() {
		l := line{Fn: "label_selector"}
		in(&l, s)
		sel, err := labels.Parse(s)
		if err != nil {
			result(&l, "", err)
		} else {
			result(&l, sel.String(), nil)
		}
		emit(l)
	}
	for _, s := range fieldCases() {
		l := line{Fn: "field_selector"}
		in(&l, s)
		sel, err := fields.ParseSelector(s)
		if err != nil {
			result(&l, "", err)
		} else {
			result(&l, sel.String(), nil)
		}
		emit(l)
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "go-edge:", err)
		os.Exit(1)
	}
}
