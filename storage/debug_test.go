package storage

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func smapsBreakdown(t testing.TB) map[string]int {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]int{}
	cur := "anon"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") {
			cur = "anon"
			if len(fields) >= 6 {
				cur = filepath.Ext(fields[5])
				if cur == "" {
					cur = fields[5]
				}
				if len(fields) > 6 {
					cur += "(deleted)"
				}
			}
			continue
		}
		if len(fields) >= 2 && fields[0] == "Rss:" {
			kb, _ := strconv.Atoi(fields[1])
			out[cur] += kb / 1024
		}
	}
	return out
}
