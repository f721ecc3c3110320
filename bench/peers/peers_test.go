package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseInfo(t *testing.T) {
	t.Parallel()
	info := "# Commandstats\r\n" +
		"cmdstat_set:calls=4000,usec=6000,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=2000,usec=40000,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
		"# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.750000\r\nused_cpu_sys_children:9.000000\r\nused_cpu_sys_main_thread:1.000000\r\n"
	got := parseInfo(info)
	if want := (serverStats{calls: 6000, cpuUs: 2_000_000}); got != want {
		t.Fatalf("parseInfo = %+v, want %+v (info and config left out, children and main thread not added)", got, want)
	}
}

func TestPayloadIsJSON(t *testing.T) {
	t.Parallel()
	var v struct {
		Order  string `json:"order"`
		Amount int    `json:"amount"`
	}
	if err := json.Unmarshal(payload("r1-idem", 42), &v); err != nil || v.Order != "r1-idem-42" || v.Amount != 1000 {
		t.Fatalf("payload = %s (%v), decoded %+v", payload("r1-idem", 42), err, v)
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	sc := scenario{Store: "redis", Kind: "new", Conc: 1}
	var samples []sample
	for rep, v := range []struct{ idem, pt, raw float64 }{{100, 50, 200}, {300, 100, 400}, {200, 80, 300}} {
		samples = append(samples,
			sample{Scenario: sc.name(), Side: sideIdem, Rep: rep + 1, OpsPerS: v.idem, CPUus: 10, ServerUs: 30},
			sample{Scenario: sc.name(), Side: sidePowertools, Rep: rep + 1, OpsPerS: v.pt, CPUus: 40},
			sample{Scenario: sc.name(), Side: sideGoRaw, Rep: rep + 1, OpsPerS: v.raw, CPUus: 5, ServerUs: 20})
	}
	rows := summarize([]scenario{sc}, samples)
	if len(rows) != 3 || rows[0].Side != sideIdem || rows[1].Side != sidePowertools || rows[2].Side != sideGoRaw {
		t.Fatalf("rows %+v: want idem, powertools, go-raw", rows)
	}
	idem := rows[0]
	if idem.OpsPerS != 200 || idem.VsPeerOps != 2.5 || idem.VsPeerCPU != 0.25 || idem.VsRawOps != 200.0/300 || idem.VsRawServer != 1.5 {
		t.Fatalf("idem row %+v: want median 200 and ratios of the medians 2.5, 0.25, 0.667, 1.5", idem)
	}
	if idem.OpsPerSRange != [2]float64{100, 300} || idem.Repetitions != 3 {
		t.Fatalf("idem row %+v: want range 100–300 over 3 repetitions", idem)
	}
	var md strings.Builder
	writeMarkdown(&md, meta{Reps: 3, Calls: 10}, rows)
	if !strings.Contains(md.String(), "| Redis new | 2.50× | 0.25 | 0.67 |") {
		t.Fatalf("markdown lacks the summary row:\n%s", md.String())
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
