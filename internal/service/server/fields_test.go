package server_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/service/server"
)

// TestFieldNamesExact: encoding/json matches member names without regard
// to case and keeps the last of a repeated member, so {"ID": "u1"} and
// {"id": "u5", "id": "u6"} would be counted. Every body the service reads
// must name its fields exactly and once; anything else is a 400 naming the
// field, and nothing is counted, refunded, reset or released.
func TestFieldNamesExact(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	ts := httptest.NewServer(server.New(server.Config{Limiter: countlimit.New(store), Rules: leaseRules(t), Logger: quiet}))
	defer ts.Close()
	a := api{t, ts.URL}

	// State the bad bodies below must leave alone.
	a.expect("/v1/allow", `{"rule": "sms.code", "id": "keep"}`, true, 0, "1/2")
	lease := a.acquire(`{"rule": "export.running", "id": "keep"}`, true, 0, "1/3")

	checks := []string{"/v1/allow", "/v1/peek", "/v1/refund", "/v1/reset"}
	for i, tc := range []struct {
		paths []string
		body  string
		field string
	}{
		{checks, `{"RULE": "sms.code", "id": "keep"}`, "RULE"},
		{checks, `{"Rule": "sms.code", "Id": "keep"}`, "Rule"},
		{checks, `{"rule": "sms.code", "ID": "keep"}`, "ID"},
		{checks, `{"rule": "sms.code", "Id": "u1"}`, "Id"},
		{checks, `{"rule": "sms.code", "iD": "u1"}`, "iD"},
		{checks, `{"rule": "sms.code", "id": "keep", "Cost": 1}`, "Cost"},
		{checks, `{"rule": "sms.code", "id": "keep", "coſt": 1}`, "coſt"}, // ſ folds to s in encoding/json
		{checks, `{"rule": "sms.code", "id": "keep", "TIER": "free"}`, "TIER"},
		{checks, `{"rule": "sms.code", "id": "u5", "id": "u6"}`, "id"},
		{checks, `{"rule": "sms.code", "id": "keep", "id": "keep"}`, "id"},
		{checks, `{"rule": "nope", "rule": "sms.code", "id": "keep"}`, "rule"},
		{checks, `{"rule": "sms.code", "id": "keep", "cost": 1, "cost": 1}`, "cost"},
		{checks, `{"rule": "sms.code", "id": "u5", "ID": "u6"}`, "ID"},
		{checks, `{"ID": "u5", "rule": "sms.code", "id": "u6"}`, "ID"},
		{checks, `{"rule": "sms.code", "i\u0064": "u5", "id": "u6"}`, "id"}, // one name, spelt two ways
		{[]string{"/v1/acquire"}, `{"RULE": "export.running", "id": "keep"}`, "RULE"},
		{[]string{"/v1/acquire"}, `{"rule": "export.running", "id": "u5", "id": "u6"}`, "id"},
		{[]string{"/v1/acquire"}, `{"rule": "upload", "id": "keep", "Tier": "free"}`, "Tier"},
		{[]string{"/v1/acquire"}, `{"rule": "upload", "id": "keep", "tier": "free", "tier": "pro"}`, "tier"},
		{[]string{"/v1/release", "/v1/extend"}, `{"LEASE": "` + lease + `"}`, "LEASE"},
		{[]string{"/v1/release", "/v1/extend"}, `{"leaſe": "` + lease + `"}`, "leaſe"},
		{[]string{"/v1/release", "/v1/extend"}, `{"lease": "` + lease + `", "lease": "` + lease + `"}`, "lease"},
		{[]string{"/v1/release", "/v1/extend"}, `{"lease": "` + lease + `", "Rule": "export.running"}`, "Rule"},
		{[]string{"/v1/release", "/v1/extend"}, `{"lease": "` + lease + `", "id": "keep", "ID": "keep"}`, "ID"},
		{[]string{"/v1/release", "/v1/extend"}, `{"lease": "` + lease + `", "rule": "export.running", "rule": "export.running"}`, "rule"},
	} {
		for _, path := range tc.paths {
			code, out := a.do("POST", path, tc.body)
			msg, _ := out["error"].(string)
			if code != 400 || out["field"] != tc.field || !strings.Contains(msg, `"`+tc.field+`"`) {
				t.Errorf("step %d: POST %s %s: %d %v; want 400 naming field %q", i, path, tc.body, code, out, tc.field)
			}
		}
	}

	a.expect("/v1/peek", `{"rule": "sms.code", "id": "keep"}`, true, 0, "1/2")
	for _, id := range []string{"u1", "u5", "u6"} {
		a.expect("/v1/peek", `{"rule": "sms.code", "id": "`+id+`"}`, true, 0, "0/2")
		a.expect("/v1/peek", `{"rule": "export.running", "id": "`+id+`"}`, true, 0, "0/3")
	}
	a.expect("/v1/peek", `{"rule": "export.running", "id": "keep"}`, true, 0, "1/3")
	a.expect("/v1/peek", `{"rule": "upload", "id": "keep", "tier": "free"}`, true, 0, "0/1")
	a.leaseCall("/v1/release", lease, "", 200, "") // the lease was held all along
	a.expect("/v1/peek", `{"rule": "export.running", "id": "keep"}`, true, 0, "0/3")
}
