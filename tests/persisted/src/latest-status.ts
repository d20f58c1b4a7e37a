import { graphql } from '../gen';

// The current status of a trip: the STATUS cell with the highest ref key
// (changes with every write, so never cached without revalidation).
export const TripStatus = graphql(`
  query TripStatus($rowKey: UUID!) {
    trips {
      latestCell(rowKey: $rowKey, column: STATUS) {
        ...CellFields
      }
    }
  }
`);
