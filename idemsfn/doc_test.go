package idemsfn_test

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// docs/stepfunctions.md shows the states DynamoDBCompleteStates returns
// for table "idem", as they are. (The module's zip holds no docs/: there
// the test skips.)
func TestDocsShowTheDynamoDBStates(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/stepfunctions.md")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no ../docs/stepfunctions.md: not in the repository's working tree")
	}
	if err != nil {
		t.Fatal(err)
	}
	states, err := idemsfn.DynamoDBCompleteStates(dynamostore.Config{Table: "idem"})
	if err != nil {
		t.Fatal(err)
	}
	want := "```json\n" + string(states) + "\n```\n"
	if !strings.Contains(string(b), want) {
		t.Errorf("docs/stepfunctions.md does not show the states as DynamoDBCompleteStates returns them:\n%s", want)
	}
}
